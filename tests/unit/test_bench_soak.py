"""The soak's own parts without servers: the split of the load, interval rows, the gates on made-up samples, the
stubs a publish replaces, and the files it writes."""

import argparse
import json
import math
import os

import pytest

from bench.load.stats import Tally
from bench.soak.__main__ import parse
from bench.soak.judge import judge, publish_gate
from bench.soak.load import interval_row, merged, split_rates
from bench.soak.report import series_name, write_outputs
from bench.usage import Watcher


def test_series_names():
    assert series_name("rss_mib.facade") == "RSS facade"
    assert series_name("pss_mib.resnet50_0_0@v2") == "PSS resnet50_0_0@v2"
    assert series_name("fds.supervisor") == "open fds supervisor"
    assert series_name("shm_mib") == "/dev/shm allocated"
    assert series_name("shm_files") == "/dev/shm regions"


def test_each_stream_gets_the_same_share_of_the_machines_time():
    capacities = [20.0, 500.0, 1000.0, 1000.0]
    rates = split_rates(capacities, 0.7)
    # Busy rate / capacity of the time each: equal shares, 70% in all.
    assert [r / c for r, c in zip(rates, capacities, strict=True)] == pytest.approx([0.175] * 4)
    assert sum(r / c for r, c in zip(rates, capacities, strict=True)) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        split_rates([10.0, 0.0], 0.7)


def test_an_interval_row_counts_ok_calls_errors_by_status_skips_and_lag():
    tally = Tally(skipped=3, max_lag=0.0125)
    for seconds in (0.010, 0.020, 0.030, 0.040):
        tally.add("OK", seconds)
    tally.add("UNAVAILABLE", 0.001)
    tally.add("RESOURCE_EXHAUSTED", 0.002)
    tally.add("UNAVAILABLE", 0.001)
    row = interval_row(tally, 2.0, "facade.")
    assert row == {
        "facade.ok": 4,
        "facade.rps": 2.0,
        "facade.p50_ms": pytest.approx(25.0),
        "facade.p99_ms": pytest.approx(39.7),
        "facade.errors": 3,
        "facade.errors_by_status": "RESOURCE_EXHAUSTED:1 UNAVAILABLE:2",
        "facade.skipped": 3,
        "facade.max_lag_ms": 12.5,
    }
    empty = interval_row(Tally(), 0.0)
    assert empty["ok"] == 0 and empty["rps"] == 0.0 and math.isnan(empty["p50_ms"])


def test_merged_tallies_keep_every_call():
    one, two = Tally(skipped=1, max_lag=0.2), Tally(max_lag=0.5)
    one.add("OK", 0.1)
    two.add("OK", 0.3)
    two.add("UNAVAILABLE", 0.01)
    both = merged([one, two])
    assert both.count() == 2 and both.errors == {"UNAVAILABLE": 1} and both.skipped == 1 and both.max_lag == 0.5


def _args(**overrides) -> argparse.Namespace:
    values = {"warmup": 100.0, "max_growth_mib_per_10min": 1.0, "max_count_rise": 2.0, "max_rejected": 0.01}
    return argparse.Namespace(**{**values, **overrides})


def _rows(seconds: int = 600, leak_mib_per_10min: float = 0.0, fd_leak_every: int = 0) -> list[dict]:
    """Samples every 10 s: flat servers (after a warm-up step) unless told to leak; a stub published at 300 s."""
    rows = []
    for t in range(0, seconds + 1, 10):
        row = {
            "t_s": float(t),
            "rss_mib.tritonserver": (100.0 if t < 50 else 120.0) + leak_mib_per_10min * t / 600,
            "pss_mib.tritonserver": 90.0,
            "rss_mib.facade": 80.0 + (0.3 if t % 20 else 0.0),  # noise, no trend
            "pss_mib.facade": 70.0,
            "rss_mib.supervisor": 60.0,
            "pss_mib.supervisor": 40.0,
            "fds.tritonserver": 70 + (t // fd_leak_every if fd_leak_every else 0),
            "threads.tritonserver": 400 + (40 if 300 <= t < 330 else 0),  # a publish's stubs, for a moment
            "fds.facade": 30,
            "threads.facade": 12,
            "pss_mib.total": 500.0,
            "shm_mib": 240.0,
            "shm_files": 12 + (2 if 300 <= t < 330 else 0),
        }
        if t >= 300:  # a published version's stub: its own warm-up, then flat
            row["rss_mib.m_0_0@v2"] = 300.0 if t >= 330 else 100.0 + t - 300
            row["fds.m_0_0@v2"] = 20
        rows.append(row)
    return rows


def _results() -> dict:
    streams = {f"{p}.m": {"versions": {"1": 10, "2": 5}} for p in ("facade", "triton")}
    paths = {p: {"ok": 15, "wrong": 0, "sent": 15, "errors": {}} for p in ("facade", "triton")}
    return {
        "totals": {"streams": streams, "paths": paths},
        "publishes": [{"t_s": 300.0, "model": "m", "version": 2, "seconds": 5.0, "error": "", "serving": "m serves 2"}],
        "publishes_due": 1,
    }


def test_a_steady_run_with_a_publish_passes_every_gate():
    results = _results()
    gates = judge(_rows(), results, _args(), [])
    assert all(g.passed for g in gates), [g for g in gates if not g.passed]
    stub = next(t for t in results["trends"] if t["column"] == "rss_mib.m_0_0@v2")
    assert stub["samples"] == 21  # from 400 s: its first sample at 300 plus its own 100 s of warm-up


def test_memory_growth_above_the_limit_fails_its_gate():
    gates = {g.name: g for g in judge(_rows(leak_mib_per_10min=3.0), _results(), _args(), [])}
    [rss] = [g for name, g in gates.items() if name.startswith("RSS")]
    assert not rss.passed and "RSS tritonserver" in rss.detail
    assert all(g.passed for name, g in gates.items() if not name.startswith("RSS"))


def test_a_count_that_keeps_rising_fails_a_passing_rise_does_not():
    gates = {g.name.split(" flat")[0]: g for g in judge(_rows(fd_leak_every=60), _results(), _args(), [])}
    assert not gates["open fds"].passed and "open fds tritonserver" in gates["open fds"].detail
    assert gates["threads"].passed and gates["/dev/shm regions"].passed


def test_wrong_answers_failed_calls_rejections_and_incidents_fail_their_gates():
    results = _results()
    results["totals"]["paths"]["triton"] = {
        "ok": 100,
        "wrong": 1,
        "sent": 120,
        "errors": {"INTERNAL": 1, "UNAVAILABLE": 19},
    }
    failed = {g.name for g in judge(_rows(), results, _args(), ["facade exited during the run"]) if not g.passed}
    assert failed == {
        "every answer right (each output against in-process ONNX Runtime)",
        "no call failed but the documented rejections",
        "documented rejections (RESOURCE_EXHAUSTED, UNAVAILABLE) at most 1.0% of calls",
        "no process died or restarted; nothing left behind after the stop",
    }


def test_wrong_answers_before_the_paced_load_fail_their_gate():
    results = {**_results(), "wrong_before_paced": {"facade.m": 1}}
    gates = {g.name: g for g in judge(_rows(), results, _args(), [])}
    answers = gates["every answer right (each output against in-process ONNX Runtime)"]
    assert not answers.passed and "wrong before the paced load" in answers.detail
    assert gates["no call failed but the documented rejections"].passed


def test_a_publish_counts_only_once_both_paths_answered_from_the_new_version():
    published = _results()["publishes"]
    streams = {"facade.m": {"versions": {"1": 9, "2": 3}}, "triton.m": {"versions": {"1": 9}}}
    gate = publish_gate(published, streams, expected=1)
    assert not gate.passed and "no triton answer from m version 2" in gate.detail
    assert not publish_gate([{**published[0], "version": None, "error": "load failed"}], streams, 1).passed
    assert not publish_gate([], streams, expected=1).passed  # one was due
    assert publish_gate([], streams, expected=0).passed


def test_too_short_a_run_is_not_judged():
    gates = judge(_rows(seconds=100), _results(), _args(), [])
    assert not gates[0].passed and gates[0].name.startswith("the servers' memory was judged")


def test_a_stub_replaced_by_a_newer_version_did_not_die():
    watcher = Watcher(os.getpid(), os.getpid())
    watcher.stub_pids = {"m_0_0@v1": [1], "m@v2": [2], "m_0_0@v2": [3], "n_0_0@v1": [4]}
    watcher.stub_versions = {"m_0_0@v1": ("m", "1"), "m@v2": ("m", "2"), "m_0_0@v2": ("m", "2"), "n_0_0@v1": ("n", "1")}
    # v1 unloaded after the publish, the auto-complete stub of v2 exited by itself, n's only stub died.
    watcher.missing = {"m_0_0@v1", "m@v2", "n_0_0@v1"}
    assert watcher.died() == {"n_0_0@v1"}


def test_the_command_line_defaults_to_an_hour_with_a_publish_every_ten_minutes():
    args = parse([])
    assert (args.duration, args.interval, args.publish_every, args.warmup) == (3600.0, 10.0, 600.0, 600.0)
    assert args.load_fraction == 0.7 and args.max_growth_mib_per_10min == 1.0
    assert args.models == ["resnet50", "mobilenet_v3_small", "text_classifier", "token_classifier"]
    assert args.publish_models == args.models
    assert parse(["--duration", "30"]).warmup == 10.0  # a third of a short run
    with pytest.raises(SystemExit):
        parse(["--publish-models", "nope"])


def test_the_report_has_every_section_and_the_samples_are_kept(tmp_path):
    rows = _rows()
    for row in rows[1:]:
        row.update({"facade.rps": 10.0, "facade.p50_ms": 5.0, "facade.p99_ms": 9.0, "triton.rps": 11.0})
        row.update({"triton.p50_ms": 4.0, "triton.p99_ms": 8.0})
    results = {
        **_results(),
        "started": "20260101T000000Z",
        "command": "python -m bench.soak",
        "machine": "test",
        "settings": {
            "models": ["m"],
            "publish_models": ["m"],
            "capacity_concurrency": 16,
            "capacity_seconds": 10.0,
            "load_fraction": 0.7,
            "deadline": 10.0,
            "max_outstanding": 32,
            "publish_every": 300.0,
            "warmup": 100.0,
            "max_growth_mib_per_10min": 1.0,
            "max_count_rise": 2.0,
        },
    }
    for stream in results["totals"]["streams"].values():
        stream.update(offered_rps=5.0, sent=15, ok=15, errors={}, skipped=0, wrong=0, p50_ms=5.0, p99_ms=9.0)
    for path in results["totals"]["paths"].values():
        path.update(skipped=0, p50_ms=5.0, p99_ms=9.0)
    gates = judge(rows, results, _args(), [])
    text = write_outputs(tmp_path, results, rows, gates)
    for section in ("## Load", "## Versions published", "## Growth after the warm-up", "## Gates"):
        assert section in text
    assert "**Verdict: PASS**" in text and "| facade.m |" in text and "| RSS m_0_0@v2 (MiB) |" in text
    assert json.loads((tmp_path / "results.json").read_text())["gates"][0]["passed"] is True
    assert (tmp_path / "samples.csv").read_text().startswith("t_s,")
    assert "| no process died or restarted; nothing left behind after the stop | passed |" in text
