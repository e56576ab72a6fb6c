"""ServingStack's start on free ports: a port taken between the pick and tritonserver's bind costs a retry, not a run."""

from __future__ import annotations

import socket

import pytest

from tritonnx.server import stack as stack_module
from tritonnx.server.process import ServerError, free_ports
from tritonnx.server.stack import ServingStack
from tritonnx.server.triton import Ports


@pytest.fixture
def taken_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_taken_before_tritonserver_binds_it_is_replaced(tmp_path, monkeypatch, taken_port):
    picks: list[list[int]] = []

    def first_pick_collides(count: int) -> list[int]:
        ports = free_ports(count)
        if not picks:
            ports[1] = taken_port  # the gRPC port, as another process might take it
        picks.append(ports)
        return ports

    monkeypatch.setattr(stack_module, "free_ports", first_pick_collides)
    (tmp_path / "repository").mkdir()
    with ServingStack(tmp_path / "repository", tmp_path, with_facade=False, startup_models=()) as stack:
        assert len(picks) == 2 and stack.triton.ports == Ports(*picks[1])
        assert stack.triton.model_states() == []


def test_fixed_ports_that_are_taken_fail_with_tritons_reason(tmp_path, taken_port):
    (tmp_path / "repository").mkdir()
    ports = Ports(*free_ports(1), taken_port, *free_ports(1))
    stack = ServingStack(tmp_path / "repository", tmp_path, triton_ports=ports, with_facade=False, startup_models=())
    with pytest.raises(ServerError, match="already in use"):
        with stack:
            pass
