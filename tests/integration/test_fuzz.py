"""A bounded fuzz campaign against a live facade in front of a real tritonserver.

Hypothesis builds `PredictRequest`s (valid ones for every model, and ones with odd fields: every dtype, shapes
with negative, zero, huge and overflowing dims, lengths that disagree, unknown names), `ClassifyRequest`s
(real images, and files that lie about their format), `ListModelsRequest`s and PredictStreams of them, then
often mutates the serialized bytes (tests/fuzz.py: bit flips, truncations, lying lengths, duplicated,
unknown and mistyped fields, huge repeated fields, non-UTF-8 strings). Everything goes through a raw channel,
bytes in and bytes out. Each call must end before its deadline with a documented status (client/facade/errors.py;
never INTERNAL: that is a model failure or a facade bug) and no server internals in its message; a valid
request must get ONNX Runtime's answer. After each campaign nothing is in flight and the facade still serves.

The requests are tests/fuzz_requests.py's. `FUZZ_SECONDS` (20 in all by default, with the KServe campaign of test_fuzz_kserve.py; `make chaos` runs 600),
`FUZZ_EXAMPLES` and `FUZZ_SEED` set the bounds and the seed (tests/fuzz.py).
"""

from __future__ import annotations

import re
import threading
import time

import grpc
import numpy as np
import psutil
import pytest

from bench.trend import GROWTH_MIB_PER_10MIN, trend
from tests import fuzz
from tests.fuzz_requests import IMAGE_MODELS, classify, list_models, predict, serialized, stream_of_predicts
from tests.helpers import metrics, wait_until
from tests.images import reference_pixels
from tests.integration.test_bad_input import INTERNALS, assert_like_onnxruntime, reference
from tests.serving import MODELS, start_facade
from tritonnx.client.facade.errors import FacadeError
from tritonnx.client.proto import inference_pb2

SERVICE = "/inference.InferenceService/"
FIRST_OUTPUT = {"resnet50": "output", "mobilenet_v3_small": "output"}


def _codes(error: type[FacadeError]) -> set[str]:
    return {error.code.name}.union(*(_codes(sub) for sub in error.__subclasses__()))


# Every status of errors.py but INTERNAL (a model failure or a facade bug) and CANCELLED (nobody cancels here).
ANSWERS = {"OK"} | _codes(FacadeError) - {"INTERNAL", "CANCELLED"}
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
TALLY = fuzz.Tally()


class RssSamples:
    """The facade's RSS (MiB) every second from its warm-up on, in a thread of the test process, until `stop`."""

    def __init__(self, pid: int) -> None:
        self.process, self.times, self.mib = psutil.Process(pid), list[float](), list[float]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="facade-rss", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.times.append(time.monotonic())
            self.mib.append(self.process.memory_info().rss / 2**20)
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def fuzzed(triton, tmp_path_factory):
    """A facade of its own, warmed up by a valid request of each model; its RSS sampled from then on."""
    facade = start_facade(triton, tmp_path_factory.mktemp("fuzzed-facade"))
    channel = grpc.insecure_channel(facade.grpc_url, options=[("grpc.max_send_message_length", 64 << 20)])
    for model in MODELS:
        still_serves(channel, model)
    print(f"fuzz seed {fuzz.SEED}, {fuzz.SECONDS:g} s, at most {fuzz.EXAMPLES} examples per campaign")
    rss = RssSamples(facade.pid)
    yield facade, channel, rss
    rss.stop()
    channel.close()
    facade.stop()


# -- checks ------------------------------------------------------------------------------------------


def shows_no_internals(message: str, sent: bytes, what: str) -> None:
    """No server internals in `message`; a quoted string the caller itself sent (a model named 'x.py') is its own."""
    own = re.sub(r"'([^']*)'", lambda quoted: "''" if quoted[1].encode() in sent else quoted[0], message)
    assert not INTERNALS.search(own), f"{what}: the message shows internals: {message!r}"


def documented(answer: fuzz.Answer, what: str, sent: bytes) -> None:
    fuzz.not_a_hang(answer, what)
    assert answer.code in ANSWERS, f"{what}: {answer.code} {answer.message!r}"
    shows_no_internals(answer.message, sent, what)
    # The facade's own message, not gRPC's refusal of a trailer too large to read (a message quoting megabytes).
    assert "metadata size exceeds" not in answer.message, f"{what}: {answer.message[:200]!r}"


def outputs_of(response: inference_pb2.PredictResponse) -> dict[str, np.ndarray]:
    if response.outputs:
        dtypes = {inference_pb2.FP32: np.float32, inference_pb2.INT64: np.int64}
        return {t.name: np.frombuffer(t.raw_data, dtypes[t.dtype]).reshape(t.shape) for t in response.outputs}
    first = FIRST_OUTPUT[response.model_name]
    return {first: np.array(response.predictions, np.float32).reshape(response.shape)}


def answered_right(body: bytes, model: str, feeds: dict[str, np.ndarray]) -> None:
    response = inference_pb2.PredictResponse.FromString(body)
    assert response.model_name == model
    assert_like_onnxruntime(model, outputs_of(response), feeds)


def still_serves(channel: grpc.Channel, model: str = "mobilenet_v3_small") -> None:
    x = np.random.default_rng(7).standard_normal((1, 3, 224, 224), np.float32)
    if model in IMAGE_MODELS:
        body, feeds = serialized(inference_pb2.PredictRequest(model_name=model, shape=x.shape), x), {"input": x}
    else:
        ids, mask = np.arange(1, 10, dtype=np.int64)[None], np.ones((1, 9), np.int64)
        tensors = [
            inference_pb2.Tensor(name=n, dtype=inference_pb2.INT64, shape=a.shape, raw_data=a.tobytes())
            for n, a in (("input_ids", ids), ("attention_mask", mask))
        ]
        body = serialized(inference_pb2.PredictRequest(model_name=model, inputs=tensors))
        feeds = {"input_ids": ids, "attention_mask": mask}
    answer = fuzz.unary(channel, SERVICE + "Predict", body)
    assert answer.code == "OK", answer
    answered_right(answer.body, model, feeds)


def came_through(facade, channel: grpc.Channel, campaign: str) -> None:
    """Nothing in flight, the facade alive and serving; prints what the campaign sent."""
    print(TALLY.report(campaign))
    in_flight = lambda: metrics(facade.http_url).value("tritonnx_facade_in_flight_requests") == 0  # noqa: E731
    wait_until(in_flight, 30, "the facade's in-flight gauge back to 0")
    assert facade.process.poll() is None, "the facade exited"
    still_serves(channel)


# -- the campaigns -----------------------------------------------------------------------------------


def test_fuzzed_predicts_get_documented_statuses_and_valid_ones_right_answers(fuzzed):
    facade, channel, _ = fuzzed

    def check(example) -> None:
        kind, body, valid = example
        answer = fuzz.unary(channel, SERVICE + "Predict", body)
        TALLY.add("Predict", kind, answer.code)
        documented(answer, kind, body)
        if valid is not None:
            assert answer.code == "OK", answer
            answered_right(answer.body, *valid)

    fuzz.campaign(0.25, predict(), check)
    came_through(facade, channel, "Predict")


def test_fuzzed_streams_answer_every_request_and_go_on(fuzzed):
    facade, channel, _ = fuzzed

    def check(requests) -> None:
        # A valid request's answer is found by its request_id (a later field 5 wins).
        bodies = [
            body + fuzz.length_delimited(5, f"valid-{i}".encode()) if valid else body
            for i, (_, body, valid) in enumerate(requests)
        ]
        answer, responses = fuzz.stream(channel, SERVICE + "PredictStream", bodies)
        for kind, _, _ in requests:
            TALLY.add("PredictStream", kind, answer.code)
        documented(answer, "stream", b"".join(bodies))
        if answer.code != "OK":  # a message above the size limit ends the stream
            return
        assert len(responses) == len(requests)
        by_id = {}
        for body in responses:
            response = inference_pb2.PredictResponse.FromString(body)
            code = CODE_NAMES[response.error.code]
            assert code in ANSWERS, f"stream: {code} {response.error.message!r}"
            shows_no_internals(response.error.message, b"".join(bodies), "stream")
            by_id[response.request_id] = (code, body)
            TALLY.statuses["PredictStream", f"a response {code}"] += 1
        for i, (_, _, valid) in enumerate(requests):
            if valid is not None:
                code, body = by_id[f"valid-{i}"]
                assert code == "OK", by_id[f"valid-{i}"]
                answered_right(body, *valid)

    fuzz.campaign(0.1, stream_of_predicts(), check)
    came_through(facade, channel, "PredictStream")


def classified_right(body: bytes, model: str, data: bytes, top_k: int) -> None:
    response = inference_pb2.ClassifyResponse.FromString(body)
    assert response.model_name == f"{model}_image"
    session = reference(model)
    scores = session.run(None, {"input": reference_pixels(data)[None]})[0][0]
    assert len(response.classes) == top_k
    # Scores as ONNX Runtime gives them (6 decimals), the best ones (ties may come in either order).
    kth = np.sort(scores)[::-1][top_k - 1]
    for item in response.classes:
        assert abs(item.score - scores[item.index]) < 1e-3 * max(1.0, abs(scores[item.index])), item
        assert item.score >= kth - 1e-3, (item, kth)


def test_fuzzed_classify_requests_and_lying_images_get_documented_statuses(fuzzed):
    facade, channel, _ = fuzzed

    def check(example) -> None:
        kind, body, valid = example
        answer = fuzz.unary(channel, SERVICE + "Classify", body)
        TALLY.add("Classify", kind, answer.code)
        documented(answer, kind, body)
        if valid is not None:
            assert answer.code == "OK", answer
            classified_right(answer.body, *valid)

    fuzz.campaign(0.2, classify(), check)
    came_through(facade, channel, "Classify")


def test_fuzzed_list_models_requests_get_documented_statuses(fuzzed):
    facade, channel, _ = fuzzed

    def check(example) -> None:
        kind, body = example
        answer = fuzz.unary(channel, SERVICE + "ListModels", body)
        TALLY.add("ListModels", kind, answer.code)
        documented(answer, kind, body)
        if answer.code == "OK":
            listed = inference_pb2.ListModelsResponse.FromString(answer.body)
            assert {m.name for m in listed.models if m.state == "READY"} >= set(MODELS)
        else:
            assert kind != "valid", answer

    fuzz.campaign(0.05, list_models(), check)
    came_through(facade, channel, "ListModels")


def test_the_facade_keeps_its_memory_flat_over_the_campaigns(fuzzed, gate):
    """Last: the facade's RSS over the campaigns, judged as the soak judges memory (a gate: a size outcome).

    The first campaign's large messages lift the allocator's high-water mark at once (74 -> 104-160 MiB, with
    the freed pages kept: malloc_trim gives back 20-40 MiB of them), so the samples of its first quarter are the
    warm-up; after it a leak shows as a slope, which bench.trend fits with least squares and with Theil-Sen.
    """
    _, channel, rss = fuzzed
    still_serves(channel)
    rss.stop()
    times = [t - rss.times[0] for t in rss.times]
    # Two minutes of samples at least: a shorter run (make test's) cannot tell a slope from the allocator's noise.
    found = trend("facade RSS", times, rss.mib, since=times[-1] / 4, min_samples=120)
    gate(
        not found.flagged,
        f"facade RSS {found.start:.0f} MiB at warm-up, peak {found.peak:.0f}, end {found.end:.0f}; after the first "
        f"quarter {found.samples} samples, growth {found.growth_per_10min:+.1f} (least squares) and "
        f"{found.robust_growth_per_10min:+.1f} (Theil-Sen) MiB per 10 min (flagged when both exceed "
        f"{GROWTH_MIB_PER_10MIN:g} MiB){'; ' + found.note if found.note else ''}",
    )
