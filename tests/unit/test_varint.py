"""The one varint codec, and the errors each of its readers turns its refusals into."""

import mmap

import pytest

from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.onnx_wire import fields
from tritonnx.backend.varint import MAX_VARINT_BYTES, VarintError, read_varint, varint
from tritonnx.client.facade.wire import Limits, WireError, check_message
from tritonnx.client.proto import inference_pb2


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**32, 2**64 - 1])
def test_what_it_encodes_it_reads_back(value):
    encoded = varint(value)
    assert read_varint(encoded + b"\x01", 0) == (value, len(encoded))
    assert read_varint(memoryview(b"\x05" + encoded), 1) == (value, 1 + len(encoded))


def test_it_reads_at_most_ten_bytes_whatever_follows():
    with pytest.raises(VarintError, match=f"longer than {MAX_VARINT_BYTES} bytes"):
        read_varint(b"\xff" * 1000, 0)
    with pytest.raises(VarintError, match="truncated varint at byte 3 of 3"):
        read_varint(b"\x01\xff\xff", 1)


def test_the_onnx_reader_and_the_facade_refuse_a_bad_varint_in_their_own_terms(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08" + b"\xff" * 20)  # field 1, a varint that never ends
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        with pytest.raises(ModelConfigError, match="truncated or not an ONNX model"):
            list(fields(data))
    with pytest.raises(WireError, match="longer than 10 bytes"):
        check_message(b"\x38" + b"\xff" * 20, Limits(inference_pb2.PredictRequest))
