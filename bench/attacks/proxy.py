"""A TCP proxy that forwards only the first bytes a client sends on each connection: a body that stalls near its end.

gRPC's Python client sends a message whole; to hold a call whose body has almost all arrived, each call gets a
connection of its own through this proxy, which passes the client's first `budget` bytes to the facade and drops
the rest, while everything the facade sends comes back (so the call still learns its status). Threads, two per
connection, on loopback; closing the proxy closes every socket, which ends them.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from contextlib import suppress

_CHUNK = 1 << 20


class StallProxy:
    """Listens on 127.0.0.1 (`port`, a free one) and forwards each connection to `upstream` (host, port)."""

    def __init__(self, upstream: tuple[str, int], budget: int) -> None:
        self.upstream = upstream
        self.budget = budget
        self.forwarded: list[int] = []  # the client's bytes passed on, per connection
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stalled(self) -> int:
        """Connections that sent their whole budget: their call's body is held short of its end."""
        return sum(sent >= self.budget for sent in self.forwarded)

    def __enter__(self) -> StallProxy:
        self._start(self._accept)
        return self

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._closed = True
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it
            sock.close()
        for thread in self._threads:
            thread.join(10)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
                index = len(self.forwarded)
                self.forwarded.append(0)
            self._start(self._upstream, client, server, index)
            self._start(self._downstream, server, client)

    def _upstream(self, client: socket.socket, server: socket.socket, index: int) -> None:
        """The client's bytes: the first `budget` passed on, the rest read and dropped, until the client closes."""
        with suppress(OSError):
            while chunk := client.recv(_CHUNK):
                room = self.budget - self.forwarded[index]
                if room > 0:
                    server.sendall(chunk[:room])
                    self.forwarded[index] += min(room, len(chunk))
        for sock in (client, server):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _downstream(self, server: socket.socket, client: socket.socket) -> None:
        with suppress(OSError):
            while chunk := server.recv(_CHUNK):
                client.sendall(chunk)
