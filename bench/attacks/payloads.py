"""The attacks' request bodies: PredictRequest bytes written on the wire, sized in elements or to a message limit.

Each body names mobilenet_v3_small and carries one crafted field, repeated or swollen; protobuf's own encoder would
take minutes (and gigabytes of Python objects) to write tens of millions of elements, so the repeated ones are one
element's bytes repeated.
"""

from __future__ import annotations

import struct

import numpy as np

from tritonnx.client.facade.wire import varint
from tritonnx.client.proto import inference_pb2

MODEL = "mobilenet_v3_small"
IMAGE_SHAPE = (1, 3, 224, 224)
SERVICE = "/inference.InferenceService/"
PREDICT = SERVICE + "Predict"
PREDICT_STREAM = SERVICE + "PredictStream"
# A body "at the limit" is this much under the facade's message limit: it fits, so it reaches the decoder.
MARGIN = 1024
_VARINT, _LEN, _FIXED32 = 0, 2, 5  # protobuf wire types
NAMED = inference_pb2.PredictRequest(model_name=MODEL).SerializeToString()  # every crafted body starts with it


def _tag(field: str, wire_type: int) -> bytes:
    number = inference_pb2.PredictRequest.DESCRIPTOR.fields_by_name[field].number
    return varint(number << 3 | wire_type)


PRIORITY_FIELD = _tag("priority", _VARINT) + varint(1)
UNPACKED_FLOAT = _tag("data", _FIXED32) + struct.pack("<f", 1.0)
EMPTY_OUTPUT_NAME = _tag("output_names", _LEN) + varint(0)
_PACKED_SHAPE = _tag("shape", _LEN)


def valid_predict(priority: int = 0) -> bytes:
    """One image for mobilenet_v3_small as `raw_data`: what the probe sends, and what some attacks swell."""
    image = np.random.default_rng(0).standard_normal(IMAGE_SHAPE, dtype=np.float32)
    request = inference_pb2.PredictRequest(
        model_name=MODEL, shape=IMAGE_SHAPE, raw_data=image.tobytes(), priority=priority
    )
    return request.SerializeToString()


def version_junk(size: int) -> bytes:
    """A valid Predict whose model_version is "1" followed by junk, `size` bytes in all (a later field wins)."""
    valid = valid_predict()
    junk = size - len(valid) - len(inference_pb2.PredictRequest(model_version="1").SerializeToString())
    junk -= len(varint(junk + 1)) - 1  # the length prefix grows with the string
    return valid + inference_pb2.PredictRequest(model_version="1" + "x" * junk).SerializeToString()


def repeated(element: bytes, count: int) -> bytes:
    """The model named, then `element` (one field's bytes) `count` times."""
    return NAMED + element * count


def fitting(element: bytes, limit: int) -> int:
    """How many `element`s a repeated body holds within `limit` less MARGIN."""
    return (limit - MARGIN - len(NAMED)) // len(element)


def packed_shape(dims: int) -> bytes:
    """A packed `shape` of `dims` dims of 1."""
    return NAMED + _PACKED_SHAPE + varint(dims) + b"\x01" * dims


def packed_shape_fitting(limit: int) -> int:
    return limit - MARGIN - len(NAMED) - len(_PACKED_SHAPE) - len(varint(limit))


def at_limit(limit: int) -> int:
    """The size of a body just under the facade's message limit."""
    return limit - MARGIN
