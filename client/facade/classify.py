"""ClassifyRequest <-> Triton's image pipeline, as pure functions.

A classifier `m` is served for images by the ensemble `m_image` (image_preprocess, then `m`):
UINT8 [batch, bytes] in, FP32 `scores` [batch, classes] out, with a labels file. The facade asks
for `scores` with Triton's classification extension, so Triton picks the top k and sends
"score:index:label" strings. The checks here are the ones that need no server: the image's size
and format, k, and whether a model is such a pipeline.

Nothing here does I/O, so every rule is unit-tested without a server.
"""

from __future__ import annotations

import struct

from tritonclient.grpc import service_pb2

from tritonnx.backend.image_format import format_problem
from tritonnx.client.facade.errors import Internal, InvalidArgument
from tritonnx.client.facade.translate import InferCall, ModelInfo
from tritonnx.client.proto import inference_pb2

PIPELINE_SUFFIX = "_image"
# The pipeline decodes a JPEG at the smallest DCT scale (1/2, 1/4, 1/8) that leaves both sides at least this
# (backend/image_preprocess.py, Pillow's draft mode); decoded pixels count 3 bytes (RGB).
DRAFT_SIDE = 256
DECODED_PIXEL_BYTES = 3
_JPEG_FRAMES = {*range(0xC0, 0xD0)} - {0xC4, 0xC8, 0xCC}  # SOF markers: they carry the frame's size
IMAGE_INPUT = "image"
SCORES_OUTPUT = "scores"
DEFAULT_TOP_K = 5


def pipeline_name(model: str) -> str:
    """The ensemble serving images for a classifier; a pipeline's own name is taken as it is."""
    return model if model.endswith(PIPELINE_SUFFIX) else model + PIPELINE_SUFFIX


def classifier_name(pipeline: str) -> str:
    return pipeline.removesuffix(PIPELINE_SUFFIX)


def image_too_large(size: int, max_image_bytes: int) -> InvalidArgument:
    return InvalidArgument(
        f"the image is {size} bytes, above this server's limit of {max_image_bytes} bytes "
        "(--max-image-bytes): send a smaller or more compressed JPEG or PNG"
    )


def check_image(image: bytes, max_image_bytes: int) -> None:
    """Raise InvalidArgument unless `image` is a JPEG or PNG file within the size limit."""
    if len(image) > max_image_bytes:
        raise image_too_large(len(image), max_image_bytes)
    problem = format_problem(image)
    if problem:
        raise InvalidArgument(problem)


def image_size(image: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR or a JPEG's frame header, read without decoding; None when not found."""
    if image[:8] == b"\x89PNG\r\n\x1a\n" and image[12:16] == b"IHDR" and len(image) >= 24:
        return struct.unpack(">II", image[16:24])
    if image[:2] != b"\xff\xd8":
        return None
    offset = 2
    while offset + 9 <= len(image):  # marker, length, and a frame header's precision, height and width
        if image[offset] != 0xFF:
            return None
        marker = image[offset + 1]
        if marker == 0xFF:  # fill byte
            offset += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            offset += 2
            continue
        if marker in _JPEG_FRAMES:
            height, width = struct.unpack(">HH", image[offset + 5 : offset + 9])
            return width, height
        offset += 2 + struct.unpack(">H", image[offset + 2 : offset + 4])[0]
    return None


def decoded_pixels(image: bytes) -> int:
    """The pixels the pipeline decodes `image` to (a JPEG at its reduced scale); 0 when its header says nothing."""
    size = image_size(image)
    if size is None:
        return 0
    width, height = size
    scale = 1
    if image[:2] == b"\xff\xd8":
        scale = next((s for s in (8, 4, 2) if s <= min(width // DRAFT_SIDE, height // DRAFT_SIDE)), 1)
    return -(-width // scale) * -(-height // scale)


def too_many_pixels(image: bytes, max_pixels: int) -> InvalidArgument | None:
    """InvalidArgument when `image` decodes to more than `max_pixels` pixels (read from its header)."""
    pixels = decoded_pixels(image)
    if pixels <= max_pixels:
        return None
    width, height = image_size(image) or (0, 0)
    return InvalidArgument(
        f"the image is {width} x {height} and would decode to {pixels:,} pixels, above this server's limit of "
        f"{max_pixels:,} (--max-image-pixels): send a smaller image (the pipeline works at {DRAFT_SIDE} pixels)"
    )


def class_count(info: ModelInfo) -> int:
    """The number of classes of an image pipeline; InvalidArgument when `info` is not one."""
    inputs = [(t.name, t.datatype, t.shape) for t in info.inputs]
    scores = next((t for t in info.outputs if t.name == SCORES_OUTPUT), None)
    if (
        inputs != [(IMAGE_INPUT, "UINT8", (-1, -1))]
        or scores is None
        or len(scores.shape) != 2
        or scores.shape[1] < 1
        or info.max_batch_size < 1
    ):
        raise InvalidArgument(
            f"model '{info.name}' is not an image pipeline (it takes {info.describe_inputs()}): Classify needs a "
            f"model taking '{IMAGE_INPUT}' (UINT8 [-1, -1]) and returning '{SCORES_OUTPUT}' [-1, classes]"
        )
    return scores.shape[1]


def top_k(request: inference_pb2.ClassifyRequest, info: ModelInfo) -> int:
    """The k asked for (5 when unset), checked against the model's classes."""
    classes = class_count(info)
    k = request.top_k if request.HasField("top_k") else DEFAULT_TOP_K
    if not 1 <= k <= classes:
        raise InvalidArgument(
            f"top_k {k} is outside 1..{classes} (the classes of model '{classifier_name(info.name)}'): "
            f"ask for 1 to {classes} classes, or leave top_k unset for {DEFAULT_TOP_K}"
        )
    return k


def to_infer_request(
    request: inference_pb2.ClassifyRequest, info: ModelInfo, k: int, timeout_us: int | None
) -> InferCall:
    """Triton's request: the file's bytes as UINT8 [1, n], `scores` asked for with class_count k."""
    header = service_pb2.ModelInferRequest(model_name=info.name, id=request.request_id)
    header.inputs.append(
        service_pb2.ModelInferRequest.InferInputTensor(
            name=IMAGE_INPUT, datatype="UINT8", shape=[1, len(request.image)]
        )
    )
    output = header.outputs.add(name=SCORES_OUTPUT)
    output.parameters["classification"].int64_param = k
    if request.priority:
        header.parameters["priority"].uint64_param = request.priority
    if timeout_us is not None:
        header.parameters["timeout"].int64_param = timeout_us
    return InferCall(header, [memoryview(request.image)])


def _strings(raw: bytes) -> list[bytes]:
    """A BYTES tensor's elements: each a 4-byte little-endian length, then its bytes."""
    items, offset = [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        items.append(raw[offset + 4 : offset + 4 + length])
        offset += 4 + length
    return items


def to_classify_response(
    request: inference_pb2.ClassifyRequest, response: service_pb2.ModelInferResponse
) -> inference_pb2.ClassifyResponse:
    """The ClassifyResponse from Triton's "score:index:label" strings (best first)."""
    reply = inference_pb2.ClassifyResponse(
        request_id=request.request_id, model_name=response.model_name, model_version=response.model_version
    )
    if len(response.outputs) != 1 or response.outputs[0].datatype != "BYTES" or len(response.raw_output_contents) != 1:
        raise Internal(f"model '{response.model_name}' answered without its classification strings")
    for item in _strings(response.raw_output_contents[0]):
        score, index, *label = item.decode("utf-8", "replace").split(":", 2)
        reply.classes.add(index=int(index), label=label[0] if label else "", score=float(score))
    return reply
