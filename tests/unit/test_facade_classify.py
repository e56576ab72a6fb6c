"""The Classify translation and checks (client/facade/classify.py), and its servicer against a stand-in gateway."""

import asyncio
import io

import grpc
import pytest
from PIL import Image
from tritonclient.grpc import service_pb2

from tests.images import image_file
from tests.unit.fakes import PIPELINE, StandInGateway, strings_tensor
from tritonnx.client.facade import errors
from tritonnx.client.facade.admission import Admission
from tritonnx.client.facade.classifier import Classifier
from tritonnx.client.facade.classify import (
    check_image,
    class_count,
    decoded_pixels,
    image_size,
    pipeline_name,
    to_classify_response,
    to_infer_request,
    too_many_pixels,
    top_k,
)
from tritonnx.client.facade.default_model import DefaultModel
from tritonnx.client.facade.metrics import FacadeMetrics
from tritonnx.client.facade.predictor import Predictor
from tritonnx.client.facade.service import InferenceServicer
from tritonnx.client.facade.translate import ModelInfo, TensorInfo
from tritonnx.client.proto import inference_pb2

JPEG = image_file(40, 30)


def test_a_classifier_is_served_by_its_ensemble():
    assert pipeline_name("resnet50") == "resnet50_image"
    assert pipeline_name("resnet50_image") == "resnet50_image"


def test_the_image_is_checked_for_size_and_format_before_triton():
    check_image(JPEG, len(JPEG))
    with pytest.raises(
        errors.InvalidArgument, match=f"the image is {len(JPEG)} bytes, above this server's limit of 100"
    ):
        check_image(JPEG, 100)
    with pytest.raises(errors.InvalidArgument, match="the image is GIF, which is not accepted: send JPEG or PNG"):
        check_image(image_file(8, 8, "GIF"), 10**6)
    with pytest.raises(errors.InvalidArgument, match="the image is empty"):
        check_image(b"", 10**6)


@pytest.mark.parametrize(("asked", "expected"), [(None, 5), (1, 1), (1000, 1000)])
def test_k_defaults_to_five_and_may_be_every_class(asked, expected):
    request = inference_pb2.ClassifyRequest(image=JPEG) if asked is None else inference_pb2.ClassifyRequest(top_k=asked)
    assert top_k(request, PIPELINE) == expected


@pytest.mark.parametrize("asked", [0, 1001])
def test_k_outside_the_classes_is_refused_with_the_range(asked):
    with pytest.raises(errors.InvalidArgument) as caught:
        top_k(inference_pb2.ClassifyRequest(top_k=asked), PIPELINE)
    assert caught.value.message == (
        f"top_k {asked} is outside 1..1000 (the classes of model 'resnet50'): ask for 1 to 1000 classes, "
        "or leave top_k unset for 5"
    )


def test_a_model_that_is_not_an_image_pipeline_is_refused():
    text = ModelInfo("text_classifier", "", (TensorInfo("input_ids", "INT64", (-1, -1)),), PIPELINE.outputs, 32)
    with pytest.raises(errors.InvalidArgument, match="model 'text_classifier' is not an image pipeline"):
        class_count(text)
    assert class_count(PIPELINE) == 1000


def test_the_triton_request_carries_the_bytes_and_asks_for_the_top_k():
    request = inference_pb2.ClassifyRequest(image=JPEG, request_id="r1", priority=1)
    call = to_infer_request(request, PIPELINE, 7, timeout_us=250_000)
    header = call.header
    assert (header.model_name, header.id) == ("resnet50_image", "r1")
    assert [(t.name, t.datatype, list(t.shape)) for t in header.inputs] == [("image", "UINT8", [1, len(JPEG)])]
    assert [(o.name, o.parameters["classification"].int64_param) for o in header.outputs] == [("scores", 7)]
    assert header.parameters["priority"].uint64_param == 1 and header.parameters["timeout"].int64_param == 250_000
    assert [bytes(p) for p in call.payloads] == [JPEG]
    parsed = service_pb2.ModelInferRequest.FromString(call.serialize())
    assert list(parsed.raw_input_contents) == [JPEG]


def test_the_classification_strings_become_classes_best_first():
    response = service_pb2.ModelInferResponse(model_name="resnet50_image", model_version="1")
    response.outputs.add(name="scores", datatype="BYTES", shape=[1, 3])
    response.raw_output_contents.append(
        strings_tensor(b"5.017262:133:class_133", b"-0.500000:7:a label: with colons", b"0.250000:9")
    )
    reply = to_classify_response(inference_pb2.ClassifyRequest(request_id="r2"), response)
    assert (reply.model_name, reply.model_version, reply.request_id) == ("resnet50_image", "1", "r2")
    assert [(c.index, c.label, round(c.score, 6)) for c in reply.classes] == [
        (133, "class_133", 5.017262),
        (7, "a label: with colons", -0.5),
        (9, "", 0.25),
    ]
    response.outputs[0].datatype = "FP32"
    with pytest.raises(errors.Internal):
        to_classify_response(inference_pb2.ClassifyRequest(), response)


class Aborted(Exception):
    pass


class Context:
    """The servicer's view of a call: its body (read once), deadline and metadata."""

    def __init__(self, time_remaining=None) -> None:
        self.remaining = time_remaining
        self.aborted: tuple | None = None
        self.body = None

    def time_remaining(self):
        return self.remaining

    async def read(self):
        return self.body

    def invocation_metadata(self):
        return ()

    def peer(self):
        return "ipv4:127.0.0.1:40000"

    async def abort(self, code, message, trailing_metadata=()):
        self.aborted = (code, message)
        raise Aborted


def servicer(limit: int = 4):
    metrics = FacadeMetrics()
    gateway = StandInGateway()
    default = DefaultModel(gateway, "resnet50")
    classifier = Classifier(gateway, default, 10**6)
    return InferenceServicer(Predictor(gateway, default), classifier, Admission(limit, 100, metrics), metrics), gateway


def classify(service, request, context=None):
    """The Classify handler with `request` as the call's body (a malformed one: what the deserializer gives)."""
    context = context or Context()
    context.body = request
    try:
        return asyncio.run(service.classify(None, context)), context
    except Aborted:
        return None, context


def test_the_servicer_answers_and_counts_the_pipeline():
    service, gateway = servicer()
    reply, _ = classify(service, inference_pb2.ClassifyRequest(image=JPEG, timeout_ms=500), Context(10.0))
    assert [(c.index, c.label) for c in reply.classes] == [(3, "class_003")]
    ((call, timeout),) = gateway.calls
    assert 0 < timeout <= 0.5 and 0 < call.header.parameters["timeout"].int64_param <= 500_000  # the shorter deadline
    text = service.metrics.render().decode()
    assert 'tritonnx_facade_requests_total{code="OK",model="resnet50_image"} 1.0' in text


def test_the_servicer_refuses_before_triton_and_names_what_classifies():
    service, gateway = servicer()
    _, context = classify(service, inference_pb2.ClassifyRequest(image=JPEG, model_name="bert"))
    assert context.aborted == (
        grpc.StatusCode.NOT_FOUND,
        "model 'bert' has no image pipeline ('bert_image') on this server; models that classify images: resnet50",
    )
    _, context = classify(service, inference_pb2.ClassifyRequest(image=b"GIF89a..."))
    assert context.aborted[0] == grpc.StatusCode.INVALID_ARGUMENT and "GIF" in context.aborted[1]
    _, context = classify(service, errors.InvalidArgument("malformed ClassifyRequest: truncated"))
    assert context.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "malformed ClassifyRequest: truncated")
    assert gateway.calls == []
    text = service.metrics.render().decode()
    assert 'tritonnx_facade_rejections_total{reason="invalid_argument"} 2.0' in text
    assert 'tritonnx_facade_rejections_total{reason="not_found"} 1.0' in text


def test_the_servicer_shares_the_in_flight_limit():
    service, gateway = servicer(limit=1)
    ticket = service.admission.admit(100, priority=1)  # a Predict holds the only slot
    _, context = classify(service, inference_pb2.ClassifyRequest(image=JPEG))
    service.admission.release(ticket)
    assert context.aborted[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and gateway.calls == []
    assert service.admission.in_flight == 0 and service.admission.receiving == 0


def test_a_request_above_the_image_limit_is_refused_unparsed_naming_the_images_size():
    service, _ = servicer()  # --max-image-bytes 10**6
    body = inference_pb2.ClassifyRequest(image=JPEG + bytes(2 * 10**6), model_name="resnet50").SerializeToString()
    refused = service._classify_request(body)
    assert isinstance(refused, errors.InvalidArgument)
    assert refused.message.startswith(
        f"the image is {len(JPEG) + 2 * 10**6} bytes, above this server's limit of 1000000 bytes (--max-image-bytes)"
    )
    flood = inference_pb2.ClassifyRequest(priority=1).SerializeToString() * 100
    assert "more than 64 fields" in service._classify_request(flood).message
    assert service._classify_request(inference_pb2.ClassifyRequest(image=JPEG).SerializeToString()).image == JPEG


def _encoded(kind: str, size: tuple[int, int], **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(buffer, kind, **options)
    return buffer.getvalue()


def test_an_images_size_and_decoded_pixels_are_read_from_its_header():
    assert image_size(_encoded("PNG", (640, 480))) == (640, 480)
    assert image_size(_encoded("JPEG", (1024, 768), progressive=True, exif=Image.Exif())) == (1024, 768)
    assert image_size(b"\xff\xd8\xff\xe0\x00") is None and image_size(b"GIF89a") is None
    # A JPEG is decoded at the smallest DCT scale leaving both sides at least 256: 4000 x 3000 at 1/8.
    assert decoded_pixels(_encoded("JPEG", (4000, 3000))) == 500 * 375
    assert decoded_pixels(_encoded("JPEG", (300, 200))) == 300 * 200
    assert decoded_pixels(_encoded("PNG", (6000, 6000))) == 36_000_000  # PNG has no reduced decoding


def test_an_image_decoding_to_more_pixels_than_the_limit_is_refused_before_admission():
    bomb = _encoded("PNG", (6000, 6000))  # about 100 KB that decodes to 108 MB
    refused = too_many_pixels(bomb, 16_000_000)
    assert refused is not None and "6000 x 6000" in refused.message and "--max-image-pixels" in refused.message
    assert too_many_pixels(_encoded("JPEG", (8000, 6000)), 16_000_000) is None  # decoded at 1/8
    request = inference_pb2.ClassifyRequest(image=_encoded("PNG", (640, 480)))
    assert Classifier.nbytes(request) == len(request.image) + 3 * 640 * 480
