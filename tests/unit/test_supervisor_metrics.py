"""The supervisor's metrics endpoint: what it exports, on which port, and a port already taken."""

from __future__ import annotations

import urllib.request

import pytest

from tritonnx.server.metrics import SupervisorMetrics
from tritonnx.server.process import ServerError


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_models_ready_heals_and_restarts_are_served_on_a_free_port():
    metrics = SupervisorMetrics()
    port = metrics.serve("127.0.0.1", 0)
    try:
        metrics.set_model_states({"resnet50": True, "broken": False})
        metrics.model_reloads.labels("resnet50").inc()
        metrics.server_restarts.inc()
        text = scrape(port)
    finally:
        metrics.close()
    assert 'tritonnx_model_ready{model="resnet50"} 1.0' in text
    assert 'tritonnx_model_ready{model="broken"} 0.0' in text
    assert 'tritonnx_supervisor_model_reloads_total{model="resnet50"} 1.0' in text
    # A model never healed has its series at 0, so dashboards and alerts see it from the start.
    assert 'tritonnx_supervisor_model_reloads_total{model="broken"} 0.0' in text
    assert "tritonnx_supervisor_server_restarts_total 1.0" in text


def test_a_port_in_use_is_refused_with_what_to_do():
    first = SupervisorMetrics()
    port = first.serve("127.0.0.1", 0)
    try:
        with pytest.raises(ServerError, match="--supervisor-metrics-port"):
            SupervisorMetrics().serve("127.0.0.1", port)
    finally:
        first.close()
