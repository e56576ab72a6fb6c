"""The soak's own parts: its series and sample rows, its paced load against fakes, its verdict and files."""

import argparse
import asyncio
import json
import math
import os
from types import SimpleNamespace

import pytest

from bench.load.stats import Tally
from bench.soak import interval_row, judge, soak
from bench.soak_report import series_name, write_outputs
from bench.usage import Watcher
from tests.unit.test_bench_loadgen import Fake, _aio_server
from tests.unit.test_bench_usage import fake_tritonserver, stop


def test_series_names():
    assert series_name("rss_mib.facade") == "RSS facade"
    assert series_name("pss_mib.total") == "PSS total"
    assert series_name("rss_mib.mobilenet_v3_small_0_0") == "RSS mobilenet_v3_small_0_0"
    assert series_name("shm_mib") == "/dev/shm allocated"


def test_an_interval_row_counts_ok_calls_errors_by_status_skips_and_lag():
    tally = Tally(skipped=3, max_lag=0.0125)
    for seconds in (0.010, 0.020, 0.030, 0.040):
        tally.add("OK", seconds)
    tally.add("UNAVAILABLE", 0.001)
    tally.add("RESOURCE_EXHAUSTED", 0.002)
    tally.add("UNAVAILABLE", 0.001)
    row = interval_row(tally, 2.0)
    assert row == {
        "ok": 4,
        "rps": 2.0,
        "p50_ms": pytest.approx(25.0),
        "p99_ms": pytest.approx(39.7),
        "errors": 3,
        "errors_by_status": "RESOURCE_EXHAUSTED:1 UNAVAILABLE:2",
        "skipped": 3,
        "max_lag_ms": 12.5,
    }
    empty = interval_row(Tally(), 0.0)
    assert empty["ok"] == 0 and empty["rps"] == 0.0 and math.isnan(empty["p50_ms"]) and math.isnan(empty["p99_ms"])


def test_the_paced_load_takes_a_sample_every_interval_then_is_judged_and_written(tmp_path):
    """The soak's loop against the fake facade and a stand-in tritonserver, then its verdict and files."""
    parent = fake_tritonserver(tmp_path, ["mobilenet_v3_small_0_0"])
    args = argparse.Namespace(
        model="mobilenet_v3_small", deadline=5.0, max_outstanding=8, duration=1.0, interval=0.25, max_rejected=0.01
    )
    rows, failures, warnings = [], [], []

    async def scenario():
        server, url = await _aio_server(Fake(fail_every=10))
        try:
            return await soak(
                args, Watcher(parent.pid, os.getpid()), url, 100.0, SimpleNamespace(requested=False), rows, failures
            )
        finally:
            await server.stop(None)

    try:
        loop_ = asyncio.run(scenario())
    finally:
        stop(parent)
    assert failures == []
    rejected = (loop_.sent + 1) // 10  # the fake fails every 10th call, the verification call the first
    assert loop_.sent + loop_.total.skipped == 100 and loop_.total.errors == {"UNAVAILABLE": rejected}
    # The idle sample at 0, then one per interval while the load runs, each at its turn or later (a slow sample delays
    # the next, never hurries it); the last one, when the load ends, unless that leaves less than half an interval.
    times, interval, slack = [row["t_s"] for row in rows], args.interval, 0.01  # t_s is rounded to 10 ms
    assert times[0] == 0.0 and len(times) >= 2 and times == sorted(set(times)), times
    assert all(t >= k * interval - slack for k, t in enumerate(times[:-1])), times
    assert times[-1] >= min((len(times) - 1) * interval, times[-2] + interval / 2) - slack, times
    # The intervals count calls once each; those that end after the last sample are in the totals only.
    assert sum(row.get("ok", 0) for row in rows) <= loop_.total.count()
    assert {
        "time",
        "ok",
        "rps",
        "p50_ms",
        "p99_ms",
        "errors_by_status",
        "skipped",
        "max_lag_ms",
        "outstanding",
        "rss_mib.facade",
        "rss_mib.mobilenet_v3_small_0_0",
        "pss_mib.total",
        "shm_mib",
    } <= set(rows[1])

    results = {
        "started": "20260101T000000Z",
        "command": "python -m bench.soak",
        "machine": "test",
        "settings": {"model": args.model, "load_fraction": 0.7, "deadline": 5.0, "max_outstanding": 8},
        "thresholds": {
            "growth_mib_per_10min": 10.0,
            "growth_fraction": 0.05,
            "p99_growth_ms_per_10min": 5.0,
            "p99_growth_fraction": 0.5,
            "documented_rejections": ["UNAVAILABLE"],
        },
        "offered_rps": 100.0,
        "load_seconds": 1.0,
        "generator_cpu": 0.2,
        "idle_sample": rows[0],
    }
    judge(rows, loop_, args, results, failures, warnings)
    # One call in ten was rejected: above --max-rejected 1%. (This test process plays the facade: a second
    # of its memory projected to 10 minutes may read as growth too.)
    assert (
        f"{rejected} documented rejections = {rejected / loop_.sent:.2%} of calls, above --max-rejected 1.00%"
        in failures
    )
    totals = results["totals"]
    assert totals["sent"] == loop_.sent and totals["ok"] + totals["errors"]["UNAVAILABLE"] == loop_.sent
    assert totals["p50_ms"] <= totals["p99_ms"] <= totals["max_ms"]
    assert {t["column"] for t in results["trends"]} >= {
        "rss_mib.facade",
        "pss_mib.total",
        "shm_mib",
        "fds.facade",
        "p99_ms",
    }
    results.update(failures=failures, warnings=warnings, verdict="FAIL", samples=rows)
    write_outputs(tmp_path / "out", results, rows)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "**Verdict: FAIL**" in report and "more than 10 MiB AND more than 5% of its mean" in report
    assert "| RSS facade (MiB) |" in report and "## Samples" in report
    assert json.loads((tmp_path / "out" / "results.json").read_text())["totals"]["sent"] == loop_.sent
    assert (tmp_path / "out" / "samples.csv").read_text().startswith("t_s,time,")
    for name in ("memory.png", "latency.png", "shm.png"):
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"
