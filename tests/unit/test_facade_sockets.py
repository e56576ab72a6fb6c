"""The facade's accepted connections (client/facade/sockets.py): the kernel's census of them, and shutting one down,
on real loopback sockets."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tritonnx.client.facade import sockets


@contextmanager
def connected(listener: socket.socket, sources: list[str]) -> Iterator[tuple[list[socket.socket], list[socket.socket]]]:
    """One connection to `listener` from each source address: the callers' sockets, and the accepted ones."""
    port = listener.getsockname()[1]
    host = "::1" if listener.family == socket.AF_INET6 else "127.0.0.1"
    callers = [socket.create_connection((host if ":" in source else "127.0.0.1", port), source_address=(source, 0))
               for source in sources]  # fmt: skip
    accepted = [listener.accept()[0] for _ in callers]
    try:
        yield callers, accepted
    finally:
        for sock in callers + accepted:
            sock.close()


def _caller(sock: socket.socket) -> sockets.Caller:
    host, port = sock.getsockname()[:2]
    return host, port


def test_the_census_names_each_connection_to_the_port_by_its_caller_and_nothing_else():
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_server(("127.0.0.1", 0)) as other,
        connected(listener, ["127.0.0.1", "127.0.0.2", "127.0.0.2"]) as (callers, accepted),
        connected(other, ["127.0.0.1"]),
    ):
        found = sockets.census(listener.getsockname()[1])
        assert set(found) == {_caller(sock) for sock in callers}  # neither the callers' ends nor the other port's
        assert sorted(found.values()) == sorted(os.fstat(sock.fileno()).st_ino for sock in accepted)


def test_the_census_leaves_out_connections_no_process_holds():
    """A connection the server closed lingers in the kernel while its caller keeps its end (FIN_WAIT): not counted,
    nor one the server has not accepted yet; one whose caller closed first is, until the server closes it."""
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        connected(listener, ["127.0.0.1", "127.0.0.2", "127.0.0.3"]) as (callers, accepted),
    ):
        port, held = listener.getsockname()[1], {_caller(callers[1]), _caller(callers[2])}
        accepted[0].close()  # the server let go of it; its caller has not closed
        callers[1].close()  # its caller closed; the server still holds its end (CLOSE_WAIT)
        waiting = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.4", 0))  # not accepted
        with waiting:
            assert set(sockets.census(port)) == held


def test_a_dual_stack_listener_names_ipv4_callers_as_ipv4():
    with (
        socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True) as listener,
        connected(listener, ["127.0.0.1", "::1"]) as (callers, _),
    ):
        assert set(sockets.census(listener.getsockname()[1])) == {("127.0.0.1", callers[0].getsockname()[1]),
                                                                   ("::1", callers[1].getsockname()[1])}  # fmt: skip


@pytest.mark.parametrize("with_census", [True, False], ids=["census", "no census"])
def test_shutting_down_a_caller_ends_its_connection_alone(with_census: bool, monkeypatch: pytest.MonkeyPatch):
    if not with_census:  # a sandbox refusing socket diagnostics: every socket's addresses are read instead

        def refused(_port: int) -> dict[sockets.Caller, int]:
            raise PermissionError(13, "socket diagnostics refused")

        monkeypatch.setattr(sockets, "census", refused)
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        connected(listener, ["127.0.0.1", "127.0.0.2"]) as (callers, accepted),
    ):
        port = listener.getsockname()[1]
        assert sockets.shut_down({_caller(callers[1]), ("127.0.0.3", 1)}, port) == 1
        assert callers[1].recv(1) == b""  # the caller sees the connection end
        callers[0].sendall(b"x")
        assert accepted[0].recv(1) == b"x"  # the other still carries bytes
        assert sockets.shut_down({("127.0.0.3", 1)}, port) == 0
