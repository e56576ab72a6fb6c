"""deploy/monitoring checked offline with promtool: the rules, their tests, the dashboard's queries."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.manifests import TRITON_METRICS
from tests.serving import CHECKOUT
from tritonnx.client.facade.metrics import FacadeMetrics
from tritonnx.server.metrics import SupervisorMetrics
from tritonnx.server.process import ServerError
from tritonnx.server.prometheus import promtool, scrape_config

MONITORING = CHECKOUT / "deploy" / "monitoring"
# Triton 2.51's metrics beyond the inference ones (docs/user_guide/metrics.md of r24.10).
TRITON_HOST_METRICS = {"nv_cpu_utilization", "nv_cpu_memory_used_bytes", "nv_cpu_memory_total_bytes"}
PROMQL_FUNCTIONS = {"sum", "rate", "increase", "histogram_quantile", "clamp_min", "avg", "min", "max", "by", "up"}


def dashboard() -> dict:
    return json.loads((MONITORING / "grafana-dashboard.json").read_text())


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in dashboard()["panels"] for target in panel["targets"]]


def exported_metrics() -> set[str]:
    """Every series name tritonnx's processes and Triton 2.51 export (histograms with their suffixes)."""
    names = set(TRITON_METRICS) | TRITON_HOST_METRICS | {"up"}
    for registry in (FacadeMetrics().registry, SupervisorMetrics().registry):
        for family in registry.collect():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
            names |= {family.name + suffix for suffix in suffixes}
    return names


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r'"[^"]*"', "", expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"by \([^)]*\)", "", expr)  # grouping labels
    words = set(re.findall(r"\b[a-z_][a-z0-9_:]*\b", expr))
    return {w for w in words if w not in PROMQL_FUNCTIONS and ":" not in w} | ({"up"} & words)


def test_rules_pass_promtool_check():
    done = promtool("check", "rules", str(MONITORING / "rules.yml"))
    assert re.search(r"SUCCESS: (\d+) rules found", done.stdout + done.stderr)


def test_rules_unit_tests_pass():
    done = promtool("test", "rules", str(MONITORING / "rules.test.yml"))
    assert "SUCCESS" in done.stdout + done.stderr


def test_every_alert_has_a_test_and_the_four_asked_for_exist():
    rules = yaml.safe_load((MONITORING / "rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert {"TritonnxLatencySLO", "TritonnxHighRejectionRate", "TritonnxModelNotReady", "TritonnxStubHealed"} <= alerts
    tests = yaml.safe_load((MONITORING / "rules.test.yml").read_text())["tests"]
    tested = {case["alertname"] for test in tests for case in test.get("alert_rule_test", [])}
    assert tested == alerts
    for test in tests:  # an alert test that only expects silence would pass on a rule that never fires
        for case in test.get("alert_rule_test", []):
            if not case["exp_alerts"]:
                assert any(c["alertname"] == case["alertname"] and c["exp_alerts"] for t in tests
                           for c in t.get("alert_rule_test", [])), case  # fmt: skip


def test_promtool_refuses_a_broken_rule(tmp_path):
    broken = tmp_path / "rules.yml"
    broken.write_text("groups:\n  - name: g\n    rules:\n      - record: r\n        expr: rate(x[5m]\n")
    with pytest.raises(ServerError, match="promtool check rules"):
        promtool("check", "rules", str(broken))


def test_every_dashboard_query_is_valid_promql(tmp_path):
    """promtool parses each query as it would a recording rule's (Grafana's variables filled in)."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", "1m")}
        for i, expr in enumerate(dashboard_exprs())
    ]}]}  # fmt: skip
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    promtool("check", "rules", str(path))


def test_dashboard_and_rules_use_only_metrics_that_exist():
    exported = exported_metrics()
    rules = yaml.safe_load((MONITORING / "rules.yml").read_text())
    exprs = dashboard_exprs() + [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for expr in exprs:
        unknown = metric_names(expr) - exported
        assert not unknown, f"{expr}: no such metric {sorted(unknown)}"


def test_dashboard_covers_what_operators_ask_for_and_lays_out_cleanly():
    board = dashboard()
    used = set().union(*(metric_names(e) for e in dashboard_exprs()))
    for metric in (
        "nv_inference_count",  # throughput per model and replica
        "tritonnx_facade_request_duration_seconds_bucket",  # p50/p99
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_exec_count",  # average batch size
        "tritonnx_facade_rejections_total",
        "tritonnx_facade_in_flight_requests",
        "nv_inference_pending_request_count",
        "tritonnx_supervisor_model_reloads_total",  # stub restarts
    ):
        assert metric in used, metric
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}"
        grid = panel["gridPos"]
        area = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & area, f"{panel['title']} overlaps another panel"
        assert grid["x"] + grid["w"] <= 24
        cells |= area
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]


def test_scrape_config_has_one_job_per_kind_and_refuses_others(tmp_path):
    config = yaml.safe_load(scrape_config({"triton": ["a:8002", "b:8002"], "facade": [], "supervisor": ["a:8003"]},
                                          [tmp_path / "rules.yml"], "2s"))  # fmt: skip
    assert config["global"] == {"scrape_interval": "2s", "evaluation_interval": "2s"}
    assert [(j["job_name"], j["static_configs"][0]["targets"]) for j in config["scrape_configs"]] == [
        ("triton", ["a:8002", "b:8002"]),
        ("supervisor", ["a:8003"]),
    ]
    with pytest.raises(ValueError, match="unknown jobs"):
        scrape_config({"node": ["a:9100"]}, [])
