"""The delay proxy of the network-fault tests: bytes through intact and in order, held when asked, resets passed on."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.netfaults.proxy import DelayProxy


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A loopback server echoing each connection's bytes until it closes."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                while data := connection.recv(65536):
                    connection.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()
    server.close()


def received(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count and (chunk := sock.recv(65536)):
        data += chunk
    return data


def test_bytes_go_through_in_order_and_are_held_when_a_delay_is_set(echo: tuple[str, int]) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB: many chunks, each way
    with DelayProxy(echo) as proxy, socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(b"plain")
        assert received(sock, 5) == b"plain"
        assert proxy.delayed == 0
        proxy.delay = 0.01
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert received(sock, len(payload)) == payload
        sender.join()
        assert proxy.delayed >= 2  # held on the way there and on the way back


def test_a_refused_upstream_resets_the_callers_connection() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    address = closed.getsockname()
    closed.close()  # nothing listens there now
    with DelayProxy(address) as proxy, pytest.raises(ConnectionError):  # a reset: a FIN would read b"" instead
        # The reset may come before the connect returns, during the send, or at the read.
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sock.sendall(b"x")
            sock.recv(1)
