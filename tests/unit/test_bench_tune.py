"""make tune's choice and its rewrite of config.pbtxt, on recorded points (no server)."""

from pathlib import Path

from bench.tune import Candidate, apply, choose, write_choice

CONFIG = """# Tuned by `make tune` on 2026-01-01: an older note.
# Policy only: inputs, outputs, dtypes and dims are auto-completed from 1/model.onnx.
backend: "python"
max_batch_size: 16
dynamic_batching {
  max_queue_delay_microseconds: 0
  preferred_batch_size: [ 2 ]
}
instance_group [ { kind: KIND_CPU, count: 4 } ]
parameters { key: "intra_op_thread_count" value: { string_value: "0" } }
"""


def points(lone_p50: float, top_throughput: float, top_p99: float) -> dict:
    return {
        1: {"p50_ms": lone_p50, "p99_ms": lone_p50 * 2, "throughput": 20.0},
        16: {"p50_ms": 700.0, "p99_ms": top_p99, "throughput": top_throughput},
    }


ONE_THREAD = Candidate(2, 1, 0, ())
TWO_THREADS = Candidate(2, 2, 0, ())
SLOW_TAIL = Candidate(1, 2, 0, ())
RESULTS = [
    (ONE_THREAD, points(lone_p50=83.0, top_throughput=22.2, top_p99=1450.0)),
    (TWO_THREADS, points(lone_p50=46.0, top_throughput=20.8, top_p99=1430.0)),
    (SLOW_TAIL, points(lone_p50=45.0, top_throughput=23.0, top_p99=2500.0)),
]


def test_the_fastest_candidate_within_the_p99_budget_wins():
    assert choose(RESULTS, p99_budget_ms=2000)[0] == ONE_THREAD
    assert choose(RESULTS, p99_budget_ms=3000)[0] == SLOW_TAIL


def test_a_lone_request_budget_keeps_single_request_latency():
    assert choose(RESULTS, p99_budget_ms=2000, lone_p50_budget_ms=60)[0] == TWO_THREADS
    assert choose(RESULTS, p99_budget_ms=2000, lone_p50_budget_ms=40) is None


def test_apply_sets_instances_threads_delay_and_preferred_sizes():
    text = apply(CONFIG, Candidate(3, 1, 500, (4, 8)))
    assert "count: 3 }" in text and 'string_value: "1" }' in text
    assert "max_queue_delay_microseconds: 500\n  preferred_batch_size: [ 4, 8 ]" in text
    assert "[ 2 ]" not in text
    assert "preferred_batch_size" not in apply(CONFIG, Candidate(3, 1, 500, ()))


def test_write_choice_replaces_only_the_previous_note(tmp_path: Path):
    config = tmp_path / "config.pbtxt"
    config.write_text(CONFIG)
    write_choice(config, TWO_THREADS, "2026-11-22: the new measurement.")
    lines = config.read_text().splitlines()
    assert lines[0] == "# Tuned by `make tune` on 2026-11-22: the new measurement."
    assert lines[1].startswith("# Policy only:")  # the file's own comments stay
    assert "older note" not in config.read_text() and "count: 2 }" in config.read_text()
