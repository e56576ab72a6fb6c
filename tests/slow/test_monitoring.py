"""The monitoring stack against a real Prometheus scraping three supervised replicas and a facade.

Prometheus (Debian's package) scrapes every replica's Triton and supervisor metrics and the
facade's, evaluates deploy/monitoring/rules.yml, and after some traffic (and a stub killed in one
replica) every query of the Grafana dashboard returns data.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from tests.helpers import wait_until
from tests.serving import CHECKOUT, MODEL_REPOSITORY, demo_config
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc
from tritonnx.common.admin import new_admin_key
from tritonnx.server.facade import start_facade
from tritonnx.server.process import free_ports
from tritonnx.server.prometheus import PrometheusServer
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack
from tritonnx.server.supervisor import live_stubs

MONITORING = CHECKOUT / "deploy" / "monitoring"
MODEL = "mobilenet_v3_small"
CONFIG = demo_config(MODEL, 1)
# Grafana's interval variables, as Grafana would fill them for a short time range.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "5m", "$__interval": "5s"}


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of every panel, Grafana's variables filled in."""
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, expr
            queries.append((panel["title"], expr))
    return queries


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    """Three supervised replicas (metrics on free ports), a facade over them, Prometheus over all."""
    workdir = tmp_path_factory.mktemp("monitoring")
    repository = link_models(workdir / "repository", {MODEL: MODEL_REPOSITORY / MODEL}, {MODEL: CONFIG})
    key = new_admin_key()
    stacks = [
        ServingStack(
            repository,
            workdir / f"replica-{i}",
            with_facade=False,
            admin_key=key,
            supervised=True,
            supervisor_metrics_port=0,
        )  # fmt: skip
        for i in range(3)
    ]
    facade = prometheus = None
    try:
        for stack in stacks:
            stack.start_triton()
        facade = start_facade(
            ",".join(stack.triton.grpc_url for stack in stacks),
            key,
            workdir / "facade.log",
            ["--default-model", MODEL, "--health-interval", "1"],
        )
        prometheus = PrometheusServer(
            workdir=workdir / "prometheus",
            targets={
                "triton": [stack.triton.metrics_url.removeprefix("http://").split("/")[0] for stack in stacks],
                "facade": [facade.http_url.removeprefix("http://")],
                "supervisor": [f"127.0.0.1:{stack.supervisor_metrics_port}" for stack in stacks],
            },
            rule_files=[MONITORING / "rules.yml"],
            port=free_ports(1)[0],
            interval="1s",
        )
        prometheus.start()
        yield stacks, facade, prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        if facade is not None:
            facade.stop()
        with ThreadPoolExecutor(len(stacks)) as pool:  # each takes seconds to unload its models
            list(pool.map(ServingStack.stop, stacks))


def traffic(facade, seconds: float) -> dict[str, int]:
    """8 callers for `seconds` through the facade, every 10th call with a wrong shape; statuses counted."""
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32).tobytes()
    deadline = time.monotonic() + seconds

    def caller(index: int) -> dict[str, int]:
        statuses: dict[str, int] = {}
        with grpc.insecure_channel(facade.grpc_url) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            while time.monotonic() < deadline:
                index += 8
                shape = [1, 3, 224, 224] if index % 10 else [1, 3, 224, 223]
                try:
                    stub.Predict(
                        inference_pb2.PredictRequest(raw_data=image, shape=shape, model_name=MODEL), timeout=10
                    )
                    code = "OK"
                except grpc.RpcError as error:
                    code = error.code().name
                statuses[code] = statuses.get(code, 0) + 1
        return statuses

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(caller, range(8)))
    return {code: sum(r.get(code, 0) for r in results) for r in results for code in r}


def wait_for(prometheus: PrometheusServer, promql: str, timeout: float = 30) -> list[dict]:
    return wait_until(lambda: prometheus.query(promql), timeout, f"data for {promql}", 0.5)


def test_every_target_is_scraped(monitored):
    _, _, prometheus = monitored

    def targets() -> list[dict]:
        return prometheus.api("targets")["activeTargets"]

    def all_up() -> list[dict] | None:
        found = targets()
        return found if len(found) == 7 and all(t["health"] == "up" for t in found) else None

    # Service discovery and the first scrapes take a few seconds.
    up = wait_until(
        all_up,
        30,
        lambda: f"7 targets up, not {[(t['scrapeUrl'], t['health'], t['lastError']) for t in targets()]}",
        0.5,
    )
    assert sorted(t["labels"]["job"] for t in up) == ["facade"] + ["supervisor"] * 3 + ["triton"] * 3


def test_the_rules_load_and_a_healed_stub_fires_its_alert(monitored):
    stacks, _, prometheus = monitored
    groups = prometheus.api("rules")["groups"]
    assert sorted(g["name"] for g in groups) == ["tritonnx.alerts", "tritonnx.recording"]
    assert all(rule["health"] == "ok" for g in groups for rule in g["rules"]), groups
    victim = stacks[2]
    (stub,) = live_stubs(victim.triton.pid).values()
    os.kill(stub.pid, signal.SIGKILL)
    wait_until(lambda: victim.supervisor.reloads, 60, "the supervisor healing the stub", 0.2)
    instance = f"127.0.0.1:{victim.supervisor_metrics_port}"

    def alerts() -> list[dict]:
        return prometheus.api("alerts")["alerts"]

    healed = wait_until(
        lambda: [a for a in alerts() if a["labels"]["alertname"] == "TritonnxStubHealed"],
        30,
        lambda: f"the TritonnxStubHealed alert, among {alerts()}",
        0.5,
    )
    assert [(a["labels"]["model"], a["labels"]["instance"], a["state"]) for a in healed] == [
        (MODEL, instance, "firing")
    ]
    ready = prometheus.query(f'tritonnx_model_ready{{instance="{instance}"}}')
    assert [float(r["value"][1]) for r in ready] == [1.0]  # the reloaded model serves again


def test_every_dashboard_query_returns_data_after_traffic(monitored):
    stacks, facade, prometheus = monitored
    statuses = traffic(facade, seconds=8)
    assert statuses.get("OK", 0) > 100 and statuses.get("INVALID_ARGUMENT", 0) > 5, statuses
    assert set(statuses) == {"OK", "INVALID_ARGUMENT"}, statuses
    empty = dashboard_queries()

    def every_panel_has_data() -> bool:  # the next scrapes bring the last calls in
        empty[:] = [(title, promql) for title, promql in empty if not prometheus.query(promql)]
        return not empty

    wait_until(every_panel_has_data, 30, lambda: f"data in every panel, not in {empty}", 0.5)

    # What the panels show matches what was done.
    throughput = prometheus.query(dashboard_queries()[0][1])
    assert len(throughput) == 3 and all(float(r["value"][1]) > 0 for r in throughput), throughput
    rejections = 'sum by (reason) (increase(tritonnx_facade_rejections_total{job="facade"}[1m]))'
    counted = wait_until(
        lambda: [r for r in prometheus.query(rejections) if r["metric"]["reason"] == "invalid_argument"
                 and float(r["value"][1]) >= 5], 30, "the invalid arguments sent, counted", 0.5
    )  # fmt: skip
    assert len(counted) == 1, counted
    batch = prometheus.query(
        'sum(rate(nv_inference_count{job="triton"}[1m])) / sum(rate(nv_inference_exec_count{job="triton"}[1m]))'
    )
    assert float(batch[0]["value"][1]) >= 1.0
    p99 = wait_for(prometheus, "tritonnx:facade_request_duration_seconds:p99_5m")
    assert 0 < float(p99[0]["value"][1]) < 10
