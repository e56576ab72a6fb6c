"""DistilBERT served by Triton direct, batched and each request alone: goodput, capacity and a lone request.

The model: its published size (transformers' default config, 66M parameters), random weights, exported by
torch.onnx. Each arm is measured in rounds, the order alternating, by the goodput engine with loadgen.

Run from the checkout, the model exported first (a venv with torch and transformers; no download):
    PYTHONPATH=. .venv/bin/python bench/reports/2026-11-29-transformer-batching/transformer_batching.py ONNX_FILE [ROUNDS]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench.output import median_and_interval, say
from bench.peers import goodput, servers
from tritonnx.server.repository import link_models

MODEL = "text_distilbert"  # "text" in the name: the goodput engine sends the text samples (8 to 128 tokens)
# Two instances of one thread, as the demo's text model; batches of up to 16, or of 1: each request alone.
CONFIG = """platform: "onnxruntime_onnx"
max_batch_size: {batch}
input [ {{ name: "input_ids" allow_ragged_batch: true }}, {{ name: "attention_mask" allow_ragged_batch: true }} ]
dynamic_batching {{ }}
instance_group [ {{ kind: KIND_CPU, count: 2 }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
"""
ARMS = {"batched": 16, "alone": 1}


def main(onnx_file: Path, rounds: int) -> None:
    args = argparse.Namespace(step_seconds=4.0, capacity_seconds=3.0, generator="loadgen")
    single_p50, _ = goodput.single_request_ms(MODEL, onnx_file, 3.0)
    objective = goodput.objective_ms(single_p50)
    say(f"in-process p50 {single_p50:.1f} ms: objective p99 <= {objective:.1f} ms")
    figures: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="transformer-batching-") as folder:
        source = Path(folder) / "source" / MODEL / "1"
        source.mkdir(parents=True)
        (source / "model.onnx").symlink_to(onnx_file.resolve())
        for index in range(rounds):
            for arm in list(ARMS)[index % 2 :] + list(ARMS)[: index % 2]:
                work = Path(folder) / f"{arm}-{index}"
                config = CONFIG.format(batch=ARMS[arm])
                repository = link_models(work / "repository", {MODEL: source.parent}, {MODEL: config})
                server = servers.Tritonnx(repository, MODEL, work)
                say(f"round {index + 1}, {arm} ...")
                record = goodput.measure_open(server, MODEL, onnx_file, objective, args, (), lone_seconds=3.0)
                figures[arm].append(goodput.figures(record) | {"wrong": record.get("wrong", 0)})
                say(f"  {figures[arm][-1]}")
    print(f"\nIn-process p50 {single_p50:.1f} ms; objective p99 <= {objective:.1f} ms; {rounds} rounds.\n")
    print("| arm | goodput req/s (median) | capacity req/s at c=16 | lone p50 ms | wrong answers |")
    print("|---|---|---|---|---|")
    for arm, rows in figures.items():
        median = {
            k: statistics.median(r[k] for r in rows if k in r) for k in ("goodput_rps", "capacity_rps", "lone_p50_ms")
        }
        wrong = sum(r["wrong"] for r in rows)
        print(
            f"| {arm} | {median['goodput_rps']:.1f} | {median['capacity_rps']:.1f} | {median['lone_p50_ms']:.1f} | {wrong} |"
        )
    ratios = [
        b["goodput_rps"] / a["goodput_rps"]
        for b, a in zip(figures["batched"], figures["alone"], strict=True)
        if a.get("goodput_rps")
    ]
    if ratios:
        middle, low, high, coverage = median_and_interval(ratios)
        print(f"\nbatched / alone goodput: median {middle:.2f}x, {coverage:.0%} interval {low:.2f}-{high:.2f}x")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
