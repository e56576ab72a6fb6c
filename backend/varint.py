"""Protobuf's base-128 varints, encoded and read: the one codec of the ONNX file reader and the facade's wire format.

Pure Python, importing nothing: the model adapter (in Triton's stub) and the facade both use it.
"""

from __future__ import annotations

from typing import Protocol

# A varint encodes at most 64 bits, in at most 10 bytes.
MAX_VARINT_BYTES = 10


class Bytes(Protocol):
    """What a varint is read from: bytes, a memoryview, a memory-mapped file."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> int: ...


class VarintError(ValueError):
    """The bytes hold no complete varint of at most MAX_VARINT_BYTES bytes at the position read."""


def varint(n: int) -> bytes:
    """The protobuf base-128 varint encoding of the unsigned integer `n`."""
    if n < 0:
        raise ValueError(f"varint of a negative number: {n}")
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(buffer: Bytes, pos: int) -> tuple[int, int]:
    """The varint starting at `pos`, and the position after it.

    Reads at most MAX_VARINT_BYTES bytes, whatever follows: a caller's crafted bytes cannot make it loop or grow an
    integer past 64 bits.
    """
    result = 0
    shift = 0
    end = min(len(buffer), pos + MAX_VARINT_BYTES)
    while pos < end:
        byte = buffer[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    if pos >= len(buffer):
        raise VarintError(f"truncated varint at byte {pos} of {len(buffer)}")
    raise VarintError(f"varint longer than {MAX_VARINT_BYTES} bytes ending at byte {pos}")
