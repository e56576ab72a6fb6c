"""What the fuzz campaigns share: their budget, byte mutations of serialized messages, raw calls and tallies.

A campaign is bounded twice: by `FUZZ_SECONDS` of wall clock for all campaigns together (20 by default, `make
chaos` sets 600) and by `FUZZ_EXAMPLES` examples per campaign. Hypothesis is seeded with `FUZZ_SEED` (24 by
default, printed; chunk i of a campaign runs with seed FUZZ_SEED + i, named on a failure) and keeps no
database, so a run is reproducible and writes nothing into the checkout.
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from tritonnx.client.facade.wire import read_varint, varint

DEFAULT_SECONDS = 20.0  # make test's share; the depth is make chaos's
SECONDS = float(os.environ.get("FUZZ_SECONDS", DEFAULT_SECONDS))
SEED = int(os.environ.get("FUZZ_SEED", "24"))
# A short run is bounded by its examples too; a long one (make chaos) by its time.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", 250 if SECONDS <= 2 * DEFAULT_SECONDS else 1_000_000))
# A call that does not end within this is a hang (the facade's own limits end every call sooner).
CALL_TIMEOUT_S = 30.0
HUGE = 2**63 - 1  # the largest int64, a dim whose product with anything overflows
T = TypeVar("T")
# Hypothesis caches what it learns of the code (.hypothesis/) in the working directory: not in the checkout.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "tritonnx-hypothesis")

# Hypothesis runs a campaign in chunks of this many examples, each seeded SEED + its index, until the
# campaign's time or examples run out.
CHUNK = 10


def campaign(share: float, strategy: st.SearchStrategy[T], check: Callable[[T], None]) -> int:
    """Run `check` on examples of `strategy` for `share` of FUZZ_SECONDS (at most FUZZ_EXAMPLES); returns the count.

    No shrinking (each example is a real call: the failing one is printed as drawn) and no database.
    """
    deadline, done, chunk = time.monotonic() + SECONDS * share, 0, 0
    while done < EXAMPLES and time.monotonic() < deadline:
        size = min(CHUNK, EXAMPLES - done)

        @seed(SEED + chunk)
        @settings(
            max_examples=size,
            deadline=None,
            database=None,
            phases=(Phase.explicit, Phase.generate),
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def run(example: T) -> None:
            check(example)

        try:
            run()
        except BaseException as failure:
            failure.add_note(f"fuzz: chunk {chunk} of the campaign, hypothesis seed {SEED + chunk} (FUZZ_SEED {SEED})")
            raise
        done, chunk = done + size, chunk + 1
    return done


@dataclass
class Tally:
    """Inputs sent per campaign and kind, and the statuses they got."""

    kinds: Counter[tuple[str, str]] = field(default_factory=Counter)
    statuses: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, campaign: str, kind: str, status: str) -> None:
        self.kinds[campaign, kind] += 1
        self.statuses[campaign, status] += 1

    def report(self, campaign: str) -> str:
        kinds = ", ".join(f"{k} {n}" for (c, k), n in sorted(self.kinds.items()) if c == campaign)
        statuses = ", ".join(f"{s} {n}" for (c, s), n in sorted(self.statuses.items()) if c == campaign)
        total = sum(n for (c, _), n in self.kinds.items() if c == campaign)
        return f"fuzz {campaign} (seed {SEED}): {total} inputs: {kinds}; statuses: {statuses}"


# -- the protobuf wire format ------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """A top-level field of a serialized message: its key, where its value starts, and where it ends."""

    start: int
    value_start: int
    end: int
    number: int
    wire_type: int


def fields(data: bytes) -> list[Field]:
    """The top-level fields of well-formed message bytes."""
    found, pos = [], 0
    while pos < len(data):
        start = pos
        key, pos = read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        value_start = pos
        if wire_type == 0:
            _, pos = read_varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            length, pos = read_varint(data, pos)
            value_start, pos = pos, pos + length
        found.append(Field(start, value_start, pos, number, wire_type))
    return found


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_delimited(number: int, value: bytes) -> bytes:
    return key(number, 2) + varint(len(value)) + value


def packed_varints(number: int, values: list[int]) -> bytes:
    # Negative int64 values travel as their two's complement, in 10 bytes.
    return length_delimited(number, b"".join(varint(v & (2**64 - 1)) for v in values))


# -- mutations ---------------------------------------------------------------------------------------

NON_UTF8 = (b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"abc\x80", b"\xf8\x88\x80\x80\x80")
MUTATIONS = (
    "bit flips",
    "truncation",
    "lying length",
    "duplicated field",
    "unknown field",
    "wrong wire type",
    "huge repeated field",
    "non-UTF-8 string",
)


@st.composite
def mutated(draw: st.DrawFn, data: bytes, string_fields: tuple[int, ...], repeated_field: int) -> tuple[str, bytes]:
    """`data` with one mutation of MUTATIONS: (its name, the bytes)."""
    kind = draw(st.sampled_from(MUTATIONS))
    parts = fields(data)
    if kind == "bit flips" and data:
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            out[draw(st.integers(0, len(out) - 1))] ^= 1 << draw(st.integers(0, 7))
        return kind, bytes(out)
    if kind == "truncation" and data:
        return kind, data[: draw(st.integers(0, len(data) - 1))]
    delimited = [f for f in parts if f.wire_type == 2]
    if kind == "lying length" and delimited:
        f = draw(st.sampled_from(delimited))
        real = f.end - f.value_start
        told = draw(st.sampled_from([real + 1, real + 1000, max(0, real - 1), 2**31, 2**32 + real, 2**63, 2**64 - 1]))
        return kind, data[: f.start] + key(f.number, 2) + varint(told) + data[f.value_start :]
    if kind == "duplicated field" and parts:
        f = draw(st.sampled_from(parts))
        copies = draw(st.integers(1, 3))
        return kind, data[: f.end] + data[f.start : f.end] * copies + data[f.end :]
    if kind == "wrong wire type" and parts:
        f = draw(st.sampled_from(parts))
        wire_type = draw(st.sampled_from([t for t in range(8) if t != f.wire_type]))
        return kind, data[: f.start] + key(f.number, wire_type) + data[f.start + len(key(f.number, f.wire_type)) :]
    if kind == "huge repeated field":
        count = draw(st.sampled_from([10_000, 100_000, 1_000_000]))
        if draw(st.booleans()):
            return kind, data + packed_varints(repeated_field, [draw(st.sampled_from([1, -1, HUGE]))] * count)
        return kind, data + length_delimited(repeated_field, b"") * (count // 10)
    if kind == "non-UTF-8 string" and string_fields:
        bad = draw(st.sampled_from(NON_UTF8))
        return kind, data + length_delimited(draw(st.sampled_from(string_fields)), bad)
    # An unknown field (also where the mutation drawn had nothing to work on).
    number = draw(st.sampled_from([12, 13, 99, 1000, 2**29 - 1]))
    wire_type = draw(st.sampled_from([0, 1, 2, 5]))
    value = {0: varint(HUGE), 1: struct.pack("<d", 1.5), 2: varint(3) + b"abc", 5: struct.pack("<f", 1.5)}
    return "unknown field", data + key(number, wire_type) + value[wire_type]


# -- calls -------------------------------------------------------------------------------------------


@dataclass
class Answer:
    code: str  # grpc.StatusCode name
    message: str
    body: bytes | None
    seconds: float


def unary(channel: grpc.Channel, method: str, body: bytes, timeout: float = CALL_TIMEOUT_S) -> Answer:
    """`body` as it is to `method`, the answer's bytes as they are."""
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    started = time.monotonic()
    try:
        response = call(body, timeout=timeout)
        return Answer("OK", "", response, time.monotonic() - started)
    except grpc.RpcError as error:
        return Answer(error.code().name, error.details() or "", None, time.monotonic() - started)


def stream(
    channel: grpc.Channel, method: str, bodies: list[bytes], timeout: float = CALL_TIMEOUT_S
) -> tuple[Answer, list[bytes]]:
    """Every body on one bidirectional stream: the stream's end and the responses before it."""
    call = channel.stream_stream(method, request_serializer=None, response_deserializer=None)
    responses: list[bytes] = []
    started = time.monotonic()
    try:
        for response in call(iter(bodies), timeout=timeout):
            responses.append(response)
        return Answer("OK", "", None, time.monotonic() - started), responses
    except grpc.RpcError as error:
        return Answer(error.code().name, error.details() or "", None, time.monotonic() - started), responses


def not_a_hang(answer: Answer, what: str) -> None:
    # The client's deadline ends a hung call as DEADLINE_EXCEEDED at CALL_TIMEOUT_S; the servers' own ends sooner.
    assert not (answer.code == "DEADLINE_EXCEEDED" and answer.seconds >= CALL_TIMEOUT_S - 1), f"hang: {what}"
