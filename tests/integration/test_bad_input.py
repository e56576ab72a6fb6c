"""The bad-input matrix: every kind of bad request, through the facade and straight to Triton.

One table, `CASES`, one parametrized test per path. For every case and path the test checks the
documented gRPC status, words of the message a person can act on, that the message carries no
server internals, whether the request got as far as the model (Triton's inference count of the
model), and that the server then still answers a good request correctly (against ONNX Runtime
in-process). The "What a bad request gets" table of docs/facade.md is checked against the same table.

The direct path builds requests the way a tritonclient user does; a shape that disagrees with the
data is declared with `InferInput.set_shape` after `set_data_from_numpy`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.helpers import wait_until
from tests.kserve import reference_session
from tests.serving import CHECKOUT, FACADE_MAX_MESSAGE_BYTES, onnx_file
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc

IMAGE = [1, 3, 224, 224]
# The models' first output: `predictions` of a simple facade response.
FIRST_OUTPUT = {"resnet50": "output", "mobilenet_v3_small": "output", "text_classifier": "logits"}
# Its default model gets the facade's health probes (a real inference every second), so its
# inference count cannot tell whether a request reached it; the cases use the others for that.
PROBED_MODEL = "resnet50"
# What no message may show: paths, the facade's shared-memory region, Python internals.
INTERNALS = re.compile(
    r"/work|/tmp|/dev/shm|/home|/opt|site-packages|tritonnx_facade_|triton_python_backend|Traceback|File \"|"
    r"\.py\b|onnxruntime_src|<class |Exception calling application|Unexpected <"
)


# -- requests -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """One KServe input as a tritonclient user builds it; `shape` declares another shape than the data's."""

    name: str
    array: np.ndarray
    shape: list[int] | None = None


@dataclass(frozen=True)
class Direct:
    model: str
    inputs: list[Tensor]
    version: str = ""
    outputs: list[str] | None = None


@dataclass(frozen=True)
class RawCall:
    """Bytes to a gRPC method, whatever they are."""

    method: str
    body: bytes


def image(seed: int = 0, batch: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 224, 224), dtype=np.float32)


def tokens(length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 1000, size=(1, length), dtype=np.int64)


def raw(
    array: np.ndarray, shape: list[int] | None = None, model: str = "mobilenet_v3_small", **fields
) -> inference_pb2.PredictRequest:
    """A facade request with `raw_data`: the array's bytes, dtype and (unless given) shape."""
    dtype = inference_pb2.ElementType.Value(np_to_triton_dtype(array.dtype))
    return inference_pb2.PredictRequest(
        raw_data=array.tobytes(), dtype=dtype, shape=shape or list(array.shape), model_name=model, **fields
    )


def named(*tensors: tuple[str, np.ndarray, list[int] | None]) -> inference_pb2.PredictRequest:
    """A facade request for text_classifier with named INT64 inputs."""
    return inference_pb2.PredictRequest(
        model_name="text_classifier",
        inputs=[
            inference_pb2.Tensor(name=n, dtype=inference_pb2.INT64, shape=s or list(a.shape), raw_data=a.tobytes())
            for n, a, s in tensors
        ],
    )


def one_image(shape: list[int], model: str = "mobilenet_v3_small") -> Direct:
    """One image's bytes declared with another shape."""
    return Direct(model, [Tensor("input", image(), shape)])


def text(*tensors: tuple[str, np.ndarray, list[int] | None]) -> Direct:
    return Direct("text_classifier", [Tensor(n, a, s) for n, a, s in tensors])


def nan_and_inf() -> np.ndarray:
    data = image(seed=3)
    data[0, 0, 0, :5] = np.nan
    data[0, 1, 7, :3] = np.inf
    data[0, 2, 9, :2] = -np.inf
    return data


def oversized() -> np.ndarray:
    """More images than fit in the facade's message limit (and than max_batch_size)."""
    return np.zeros((FACADE_MAX_MESSAGE_BYTES // (150528 * 4) + 1, 3, 224, 224), np.float32)


# -- the table ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    code: str  # grpc.StatusCode name
    words: tuple[str, ...] = ()  # each must be in the message
    reaches_model: bool | None = False  # got as far as the model (its inference count); None: not checked


@dataclass(frozen=True)
class Case:
    name: str  # the row of the table in docs/facade.md
    model: str  # the model whose inference count is watched and that then gets a good request
    facade: Callable[[], inference_pb2.PredictRequest | RawCall] | None
    via_facade: Expect | None
    direct: Callable[[], Direct | RawCall] | None
    via_direct: Expect | None
    # For OK answers: the feeds ONNX Runtime gets for the same result.
    reference: Callable[[], dict[str, np.ndarray]] | None = field(default=None)


def invalid(*words: str, reaches_model: bool = False) -> Expect:
    return Expect("INVALID_ARGUMENT", words, reaches_model)


IDS, MASK, EMPTY = tokens(4, seed=1), np.ones((1, 4), np.int64), np.zeros((1, 0), np.int64)
LONG = tokens(200, seed=2)
MOBILENET_EXPECTS = "model 'mobilenet_v3_small' expects input (FP32 [-1, 3, 224, 224])"
TEXT_EXPECTS = "model 'text_classifier' expects input_ids (INT64 [-1, -1]), attention_mask (INT64 [-1, -1])"

CASES = [
    Case(
        "data length does not match the shape",
        "mobilenet_v3_small",
        lambda: inference_pb2.PredictRequest(data=[0.0] * 10, shape=IMAGE, model_name="mobilenet_v3_small"),
        invalid("input 'input' carries 10 values but shape [1, 3, 224, 224] needs 150528"),
        lambda: Direct("mobilenet_v3_small", [Tensor("input", np.zeros(10, np.float32), IMAGE)]),
        invalid("input byte size mismatch for input 'input'", "Expected 602112, got 40"),
    ),
    Case(
        "wrong rank",
        "mobilenet_v3_small",
        lambda: raw(image()[0]),
        invalid("shape [3, 224, 224] (rank 3) but the model wants rank 4", MOBILENET_EXPECTS),
        lambda: Direct("mobilenet_v3_small", [Tensor("input", image()[0])]),
        invalid("unexpected shape for input 'input'", "Expected [-1,3,224,224], got [3,224,224]"),
    ),
    Case(
        "a fixed dim of another size",
        "mobilenet_v3_small",
        lambda: raw(np.zeros((1, 3, 224, 225), np.float32)),
        invalid("shape [1, 3, 224, 225], which does not fit [-1, 3, 224, 224]", MOBILENET_EXPECTS),
        lambda: Direct("mobilenet_v3_small", [Tensor("input", np.zeros((1, 3, 224, 225), np.float32))]),
        invalid("unexpected shape for input 'input'", "got [1,3,224,225]"),
    ),
    Case(
        "a dim of 0 where the model has a fixed size",
        "mobilenet_v3_small",
        lambda: raw(np.zeros((1, 3, 224, 0), np.float32)),
        invalid("shape [1, 3, 224, 0], which does not fit [-1, 3, 224, 224]", MOBILENET_EXPECTS),
        lambda: Direct("mobilenet_v3_small", [Tensor("input", np.zeros((1, 3, 224, 0), np.float32))]),
        invalid("unexpected shape for input 'input'", "got [1,3,224,0]"),
    ),
    Case(
        # Empty tensors are the model's to judge: this one pools over no token (embedding zeros).
        "empty sequence (text_classifier [1, 0])",
        "text_classifier",
        lambda: named(("input_ids", EMPTY, None), ("attention_mask", EMPTY, None)),
        Expect("OK", reaches_model=True),
        lambda: text(("input_ids", EMPTY, None), ("attention_mask", EMPTY, None)),
        Expect("OK", reaches_model=True),
        reference=lambda: {"input_ids": EMPTY, "attention_mask": EMPTY},
    ),
    Case(
        "batch size 0",
        "mobilenet_v3_small",
        lambda: raw(image(), [0, 3, 224, 224]),
        invalid("input 'input' has batch size 0: send 1 to 16 (the model's max_batch_size)"),
        # Triton hands it to the model without a batch dim (as [3, 224, 224]).
        lambda: one_image([0, 3, 224, 224]),
        invalid(
            "the first dim is the batch size, 1..16, and it is missing (a batch size of 0 arrives this way)",
            reaches_model=True,
        ),
    ),
    Case(
        "negative dim",
        "mobilenet_v3_small",
        lambda: raw(image(), [1, 3, -224, 224]),
        invalid("shape [1, 3, -224, 224]: a dim cannot be negative", MOBILENET_EXPECTS),
        lambda: one_image([1, 3, -224, 224]),
        invalid("unexpected shape for input 'input'", "got [1,3,-224,224]"),
    ),
    Case(
        "batch dim above 2^31-1 (2^31+1)",
        "mobilenet_v3_small",
        lambda: raw(image(), [2**31 + 1, 3, 224, 224]),
        invalid("dims above 2147483647 are not accepted", MOBILENET_EXPECTS),
        lambda: one_image([2**31 + 1, 3, 224, 224]),
        invalid("input byte size mismatch for input 'input'", "got 602112"),
    ),
    Case(
        # Triton 2.51 casts the batch size to a 32-bit int: 2^32+1 becomes 1, and one image's bytes fit.
        "batch dim 2^32+1 with one image's bytes",
        "mobilenet_v3_small",
        lambda: raw(image(), [2**32 + 1, 3, 224, 224]),
        invalid("shape [4294967297, 3, 224, 224]: dims above 2147483647 are not accepted"),
        lambda: one_image([2**32 + 1, 3, 224, 224]),
        Expect("OK", reaches_model=True),
        reference=lambda: {"input": image()},
    ),
    Case(
        "batch above max_batch_size",
        "mobilenet_v3_small",
        lambda: raw(np.zeros((17, 3, 224, 224), np.float32)),
        invalid("input 'input' has batch size 17, above the model's max_batch_size 16: split the request"),
        lambda: Direct("mobilenet_v3_small", [Tensor("input", np.zeros((17, 3, 224, 224), np.float32))]),
        invalid("inference request batch-size must be <= 16 for 'mobilenet_v3_small'"),
    ),
    Case(
        "wrong dtype (INT32 for FP32)",
        "mobilenet_v3_small",
        lambda: raw(np.zeros(IMAGE, np.int32)),
        invalid("input 'input' is INT32 but the model wants FP32", MOBILENET_EXPECTS),
        lambda: Direct("mobilenet_v3_small", [Tensor("input", np.zeros(IMAGE, np.int32))]),
        invalid("data-type is 'INT32', but model 'mobilenet_v3_small' expects 'FP32'"),
    ),
    Case(
        "dtype number the proto does not define",
        "mobilenet_v3_small",
        lambda: inference_pb2.PredictRequest(
            raw_data=image().tobytes(), dtype=99, shape=IMAGE, model_name="mobilenet_v3_small"
        ),
        invalid("input 'input' has dtype 99, which is not an ElementType: use one of FP32, FP16"),
        None,
        None,
    ),
    Case(
        "NaN and ±Inf values",
        "mobilenet_v3_small",
        lambda: raw(nan_and_inf()),
        Expect("OK", reaches_model=True),
        lambda: Direct("mobilenet_v3_small", [Tensor("input", nan_and_inf())]),
        Expect("OK", reaches_model=True),
        reference=lambda: {"input": nan_and_inf()},
    ),
    Case(
        "message above the size limit",
        "mobilenet_v3_small",  # 16 MiB in the tests
        lambda: raw(oversized()),
        Expect("RESOURCE_EXHAUSTED", ("Received message larger than max",)),
        # Triton takes messages up to 2 GiB: the same request is refused for its batch size.
        lambda: Direct("mobilenet_v3_small", [Tensor("input", oversized())]),
        invalid("inference request batch-size must be <= 16"),
    ),
    Case(
        "large valid request (resnet50, batch 16, 9.6 MB)",
        "resnet50",
        lambda: raw(image(seed=5, batch=16), model="resnet50"),
        Expect("OK", reaches_model=None),
        lambda: Direct("resnet50", [Tensor("input", image(seed=5, batch=16))]),
        Expect("OK", reaches_model=None),
        reference=lambda: {"input": image(seed=5, batch=16)},
    ),
    Case(
        "unknown model",
        "mobilenet_v3_small",
        lambda: raw(image(), model="resnet51"),
        Expect(
            "NOT_FOUND",
            (
                "model 'resnet51' is not served; ready models: image_preprocess, mobilenet_v3_small, "
                "mobilenet_v3_small_image, resnet50, resnet50_image, text_classifier, token_classifier",
            ),
        ),
        lambda: Direct("resnet51", [Tensor("input", image())]),
        Expect("NOT_FOUND", ("Request for unknown model: 'resnet51' is not found",)),
    ),
    Case(
        "unknown version (7)",
        "mobilenet_v3_small",
        lambda: raw(image(), model_version="7"),
        Expect("NOT_FOUND", ("model 'mobilenet_v3_small' version '7' is not served; ready models:",)),
        lambda: Direct("mobilenet_v3_small", [Tensor("input", image())], version="7"),
        Expect("NOT_FOUND", ("Request for unknown model: 'mobilenet_v3_small' version 7 is not found",)),
    ),
    Case(
        "non-numeric version ('latest')",
        "mobilenet_v3_small",
        lambda: raw(image(), model_version="latest"),
        Expect("INVALID_ARGUMENT", ("model_version 'latest' is not a version number",)),
        lambda: Direct("mobilenet_v3_small", [Tensor("input", image())], version="latest"),
        invalid("version string 'latest'", "version should be an integral value > 0"),
    ),
    Case(
        "unknown output name",
        "mobilenet_v3_small",
        lambda: raw(image(), output_names=["probs"]),
        invalid("unknown output(s) ['probs']: model 'mobilenet_v3_small' returns ['output']"),
        lambda: Direct("mobilenet_v3_small", [Tensor("input", image())], outputs=["probs"]),
        invalid("unexpected inference output 'probs' for model 'mobilenet_v3_small'"),
    ),
    Case(
        "wrong input names (text_classifier)",
        "text_classifier",
        lambda: named(("ids", IDS, None), ("mask", MASK, None)),
        invalid("unknown: ['ids', 'mask']; missing: ['input_ids', 'attention_mask']", TEXT_EXPECTS),
        lambda: text(("ids", IDS, None), ("mask", MASK, None)),
        invalid("unexpected inference input '", "' for model 'text_classifier'"),  # 'ids' or 'mask'; it names one
    ),
    Case(
        "a missing input (text_classifier)",
        "text_classifier",
        lambda: named(("input_ids", IDS, None)),
        invalid("missing: ['attention_mask']", TEXT_EXPECTS),
        lambda: text(("input_ids", IDS, None)),
        invalid("missing required input(s) ['attention_mask']"),
    ),
    Case(
        "inputs of different lengths (text_classifier)",
        "text_classifier",
        lambda: named(("input_ids", IDS, None), ("attention_mask", MASK[:, :3], None)),
        invalid("disagree on the size of dim 'sequence' (4 and 3): the model needs them equal", reaches_model=True),
        lambda: text(("input_ids", IDS, None), ("attention_mask", MASK[:, :3], None)),
        invalid("disagree on the size of dim 'sequence' (4 and 3): the model needs them equal", reaches_model=True),
    ),
    Case(
        "sequence longer than the model's 128 positions",
        "text_classifier",
        lambda: named(("input_ids", LONG, None), ("attention_mask", np.ones_like(LONG), None)),
        invalid("model 'text_classifier' cannot run on this input", "128 by 200", reaches_model=True),
        lambda: text(("input_ids", LONG, None), ("attention_mask", np.ones_like(LONG), None)),
        invalid("model 'text_classifier' cannot run on this input", "128 by 200", reaches_model=True),
    ),
    Case(
        "token id outside the vocabulary",
        "text_classifier",
        lambda: named(("input_ids", np.full((1, 4), 10**9, np.int64), None), ("attention_mask", MASK, None)),
        invalid(
            "cannot run on this input",
            "idx=1000000000 must be within the inclusive range [-1000,999]",
            reaches_model=True,
        ),
        lambda: text(("input_ids", np.full((1, 4), 10**9, np.int64), None), ("attention_mask", MASK, None)),
        invalid(
            "cannot run on this input",
            "idx=1000000000 must be within the inclusive range [-1000,999]",
            reaches_model=True,
        ),
    ),
    Case(
        "malformed protobuf",
        "mobilenet_v3_small",
        lambda: RawCall("/inference.InferenceService/Predict", b"\x0a\xff\xff\xff\xff\x0f\x00"),  # 4 GiB field 1
        invalid("malformed PredictRequest", "runs past the end of the 7-byte message"),
        lambda: RawCall("/inference.GRPCInferenceService/ModelInfer", b"\x0a\xff\xff\xff\xff\x0f\x00"),
        Expect("INTERNAL", ("Unable to parse request",)),
    ),
    Case(
        "unknown method",
        "mobilenet_v3_small",
        lambda: RawCall("/inference.InferenceService/Explain", b""),
        Expect("UNIMPLEMENTED", ("Method not found",)),
        lambda: RawCall("/inference.GRPCInferenceService/Explain", b""),
        Expect("UNIMPLEMENTED"),  # Triton's message is empty
    ),
]


def params(path: str) -> list:
    return [pytest.param(case, id=case.name) for case in CASES if getattr(case, path) is not None]


# -- calling and checking -------------------------------------------------------------------------


@dataclass
class Outcome:
    code: str
    message: str
    outputs: dict[str, np.ndarray] | None


def call_raw(channel: grpc.Channel, call: RawCall) -> Outcome:
    try:
        channel.unary_unary(call.method)(call.body, timeout=60)
        return Outcome("OK", "", None)
    except grpc.RpcError as error:
        return Outcome(error.code().name, error.details() or "", None)


def via_facade(stub, channel: grpc.Channel, request) -> Outcome:
    if isinstance(request, RawCall):
        return call_raw(channel, request)
    try:
        response = stub.Predict(request, timeout=60)
    except grpc.RpcError as error:
        return Outcome(error.code().name, error.details() or "", None)
    if response.outputs:
        dtypes = {inference_pb2.FP32: np.float32, inference_pb2.INT64: np.int64}
        outputs = {t.name: np.frombuffer(t.raw_data, dtypes[t.dtype]).reshape(t.shape) for t in response.outputs}
    else:
        first = FIRST_OUTPUT[response.model_name]
        outputs = {first: np.array(response.predictions, np.float32).reshape(response.shape)}
    return Outcome("OK", "", outputs)


def via_direct(client: grpcclient.InferenceServerClient, channel: grpc.Channel, request) -> Outcome:
    if isinstance(request, RawCall):
        return call_raw(channel, request)
    inputs = []
    for tensor in request.inputs:
        array = tensor.array
        infer_input = grpcclient.InferInput(tensor.name, list(array.shape), np_to_triton_dtype(array.dtype))
        infer_input.set_data_from_numpy(array)
        if tensor.shape is not None:
            infer_input.set_shape(tensor.shape)
        inputs.append(infer_input)
    outputs = None if request.outputs is None else [grpcclient.InferRequestedOutput(n) for n in request.outputs]
    try:
        result = client.infer(request.model, inputs, model_version=request.version, outputs=outputs, client_timeout=60)
    except InferenceServerException as error:
        return Outcome(str(error.status()).removeprefix("StatusCode."), error.message() or "", None)
    return Outcome("OK", "", {o.name: result.as_numpy(o.name) for o in result.get_response().outputs})


@cache
def reference(model: str):
    return reference_session(onnx_file(model))


def assert_like_onnxruntime(model: str, outputs: dict[str, np.ndarray], feeds: dict[str, np.ndarray]) -> None:
    session = reference(model)
    names = [o.name for o in session.get_outputs()]
    for name, expected in zip(names, session.run(names, feeds), strict=False):
        if name not in outputs:
            continue
        actual = outputs[name]
        assert actual.shape == expected.shape, name
        finite = np.abs(expected[np.isfinite(expected)])
        scale = float(finite.max()) if finite.size else 1.0
        # NaN where ONNX Runtime has NaN (equal_nan), and close elsewhere.
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * (scale or 1.0), equal_nan=True)


def good_request(model: str) -> tuple[inference_pb2.PredictRequest, Direct, dict[str, np.ndarray]]:
    """The same good request for both paths, and its ONNX Runtime feeds."""
    if model == "text_classifier":
        ids = tokens(9, seed=7)
        mask = np.ones_like(ids)
        feeds = {"input_ids": ids, "attention_mask": mask}
        return (
            named(("input_ids", ids, None), ("attention_mask", mask, None)),
            text(("input_ids", ids, None), ("attention_mask", mask, None)),
            feeds,
        )
    data = image(seed=11)
    return raw(data, model=model), Direct(model, [Tensor("input", data)]), {"input": data}


def inference_count(client: grpcclient.InferenceServerClient, triton, model: str) -> int:
    stats = client.get_inference_statistics(model, headers=triton.admin_headers).model_stats
    return sum(s.inference_count for s in stats)


def check(case: Case, expect: Expect, send: Callable[[object], Outcome], request, good, client, triton) -> None:
    before = inference_count(client, triton, case.model)
    outcome = send(request)

    assert outcome.code == expect.code, f"{case.name}: {outcome.code} {outcome.message!r}"
    for words in expect.words:
        assert words in outcome.message, f"{case.name}: {outcome.message!r}"
    assert not INTERNALS.search(outcome.message), f"{case.name} shows server internals: {outcome.message!r}"
    if expect.code == "OK" and case.reference is not None:
        assert_like_onnxruntime(case.model, outcome.outputs, case.reference())

    # The server still serves a good request, correctly.
    good_outcome = send(good[0])
    assert good_outcome.code == "OK", f"after '{case.name}': {good_outcome.code} {good_outcome.message!r}"
    assert_like_onnxruntime(case.model, good_outcome.outputs, good[1])

    if expect.reaches_model is not None:
        # Triton counts a request when the model's instance releases it, which may come just after
        # the answer: wait (bounded) for the good request to be counted, then compare.
        wanted = before + 1 + int(expect.reaches_model)
        what = f"{case.name}: the good request (and the bad one if it reaches '{case.model}') counted"
        wait_until(lambda: inference_count(client, triton, case.model) >= wanted, 10, what)
        reached = inference_count(client, triton, case.model) - before - 1
        assert reached == int(expect.reaches_model), (
            f"{case.name}: {reached} request(s) reached '{case.model}', expected {int(expect.reaches_model)}"
        )


# -- the tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def triton_client(triton):
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        yield client


@pytest.fixture(scope="module")
def triton_channel(triton):
    channel = grpc.insecure_channel(triton.grpc_url, options=[("grpc.max_send_message_length", 64 << 20)])
    yield channel
    channel.close()


@pytest.fixture(scope="module")
def facade_channel(facade):
    channel = grpc.insecure_channel(facade.grpc_url, options=[("grpc.max_send_message_length", 64 << 20)])
    yield channel
    channel.close()


@pytest.mark.parametrize("case", params("facade"))
def test_bad_input_through_the_facade(case, facade_channel, triton_client, triton):
    stub = inference_pb2_grpc.InferenceServiceStub(facade_channel)
    good, _, feeds = good_request(case.model)
    check(
        case,
        case.via_facade,
        lambda r: via_facade(stub, facade_channel, r),
        case.facade(),
        (good, feeds),
        triton_client,
        triton,
    )


@pytest.mark.parametrize("case", params("direct"))
def test_bad_input_direct_to_triton(case, triton_client, triton_channel, triton):
    _, good, feeds = good_request(case.model)
    check(
        case,
        case.via_direct,
        lambda r: via_direct(triton_client, triton_channel, r),
        case.direct(),
        (good, feeds),
        triton_client,
        triton,
    )


def documented_rows() -> dict[str, list[str]]:
    text = (CHECKOUT / "docs" / "facade.md").read_text()
    section = text.split("## What a bad request gets", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3 and not set(cells[0]) <= set("-: "):
            rows[cells[0]] = cells
    return rows


def test_the_documented_table_lists_every_case():
    rows = documented_rows()
    for case in CASES:
        assert case.name in rows, f"docs/facade.md: no row for '{case.name}'"
        for cell, expect in zip(rows[case.name][1:3], (case.via_facade, case.via_direct), strict=False):
            documented = "n/a" if expect is None else f"`{expect.code}`"
            assert cell.startswith(documented), f"docs row '{case.name}': '{cell}' should start with {documented}"
    assert len(rows) == len(CASES) + 1, "docs/facade.md has rows without a case"  # + the header row
