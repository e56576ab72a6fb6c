"""python -m tests.conformance: serve ONNX's own test models through tritonserver (make conformance).

Takes every operator and model test case the `onnx` wheel ships, keeps those that in-process
ONNX Runtime runs correctly, serves each through tritonserver with the stock model.py and a
policy-only config.pbtxt, and compares every served output with the expected one. Prints the
failures by cause and writes report.md and results.json to bench/results/<UTC time>-conformance/.
Exits 1 when a case that can be served is not served correctly.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

import onnx
import onnxruntime as ort

from bench import RESULTS
from tests.conformance.corpus import Case, Screened, corpus_root, discover, screen
from tests.conformance.exported import export, exporters_python, report, rule_verdict, serve
from tests.conformance.serving import REFUSAL_CAUSES, ConformanceRun, Verdict
from tritonnx.common.paths import Paths


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def select(cases: list[Case], patterns: list[str], limit: int | None) -> list[Case]:
    chosen = [c for c in cases if not patterns or any(p in c.name for p in patterns)]
    return chosen[:limit] if limit else chosen


def summary(verdicts: list[Verdict], excluded: list[tuple[Case, str]], total: int) -> dict:
    correct = [v for v in verdicts if v.correct]
    refused = [v for v in verdicts if v.cause in REFUSAL_CAUSES]
    failed = [v for v in verdicts if not v.correct and v.cause not in REFUSAL_CAUSES]
    causes: dict[str, list[str]] = defaultdict(list)
    for verdict in verdicts:
        if not verdict.correct:
            causes[verdict.cause].append(verdict.name)
    return {
        "corpus_cases": total,
        "runnable_in_process": len(verdicts),
        "served_correctly": len(correct),
        "identical_to_in_process": sum(v.identical for v in correct),
        "batched_by_auto_complete": sum(v.max_batch_size > 0 for v in verdicts),
        "refused_at_load": len(refused),
        "failed": len(failed),
        "failures_by_cause": {cause: names for cause, names in sorted(causes.items(), key=lambda kv: -len(kv[1]))},
        "excluded_by_onnx_runtime": dict(Counter(reason.split(":")[0] for _, reason in excluded)),
    }


def write_report(directory: Path, facts: dict, verdicts: list[Verdict], excluded: list[tuple[Case, str]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(
        json.dumps(
            {
                "summary": facts,
                "verdicts": [v.__dict__ for v in verdicts],
                "excluded": [{"name": c.name, "reason": r} for c, r in excluded],
            },
            indent=1,
        )
    )
    runnable = facts["runnable_in_process"]
    lines = [
        f"# Conformance: ONNX's test models served through tritonserver ({facts['date']})",
        "",
        f"onnx {onnx.__version__} test data (suites: {', '.join(facts['suites'])}), onnxruntime {ort.__version__}, "
        f"tritonserver 2.51, the stock model.py and a policy-only config.pbtxt per model.",
        "",
        "| | cases |",
        "|---|---|",
        f"| in the corpus (with test data) | {facts['corpus_cases']} |",
        f"| run correctly by in-process ONNX Runtime | {runnable} |",
        f"| **served correctly** (dtype, shape, values within ONNX's tolerances) | **{facts['served_correctly']}** "
        f"({facts['served_correctly'] / max(runnable, 1):.1%}) |",
        f"| of those, bit for bit what in-process ONNX Runtime gave | {facts['identical_to_in_process']} |",
        f"| batched by auto-complete (every first dim dynamic) | {facts['batched_by_auto_complete']} |",
        f"| refused at load with the reason (Triton cannot carry them) | {facts['refused_at_load']} |",
        f"| failed | {facts['failed']} |",
        "",
        "## Not served correctly, by cause",
        "",
        "| cause | cases | examples |",
        "|---|---|---|",
    ]
    for cause, names in facts["failures_by_cause"].items():
        lines.append(f"| {cause} | {len(names)} | {', '.join(names[:4])}{' ...' if len(names) > 4 else ''} |")
    lines += [
        "",
        "## Left out: in-process ONNX Runtime does not run them correctly",
        "",
        "| reason | cases |",
        "|---|---|",
    ]
    lines += [f"| {reason} | {count} |" for reason, count in facts["excluded_by_onnx_runtime"].items()]
    (directory / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance",
        description="Serve every test model of the onnx wheel that in-process ONNX Runtime runs correctly, and the "
        "exporters' corpus, through tritonserver (stock model.py, policy-only config.pbtxt) and compare every output. "
        "About 15 minutes on 2 cores for the onnx corpus, plus the exporters' venv the first time.",
        epilog="Example: python -m tests.conformance --pattern node/test_reduce --chunk-size 32",
    )
    parser.add_argument(
        "--pattern",
        action="append",
        default=[],
        help="only cases whose name (suite/test_...) contains this; repeatable",
    )
    parser.add_argument("--limit", type=int, help="at most this many cases")
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=48,
        help="models loaded at once (each a Python stub process); default: %(default)s",
    )
    parser.add_argument("--output", type=Path, help="default: bench/results/<UTC time>-conformance")
    parser.add_argument(
        "--corpus",
        choices=("onnx", "exported", "both"),
        default="both",
        help="onnx: the onnx wheel's test models; exported: models exported with torch.onnx.export from "
        "transformers, torchvision and timm (tests/conformance/exported.py; its venv is made once: a few minutes, about 9 GB of disk); "
        "default: %(default)s",
    )
    args = parser.parse_args(argv)

    started = datetime.now(timezone.utc)
    output = args.output or RESULTS / f"{started:%Y%m%dT%H%M%SZ}-conformance"
    failed = run_onnx(args, output, started) if args.corpus != "exported" else 0
    failed += run_exported(output) if args.corpus != "onnx" else 0
    say(f"report: {output / 'report.md'}")
    return 1 if failed else 0


def run_exported(output: Path) -> int:
    """The exporters' corpus, exported, served and checked; its part of report.md. How many failed."""
    python = exporters_python(Paths.from_environment().build, say)
    with tempfile.TemporaryDirectory(prefix="tritonnx-exported-") as workdir:
        say("exporting the exporters' corpus ...")
        models = export(python, [], Path(workdir) / "exported")
        rule = {model.name: rule_verdict(model.onnx_file) for model in models}
        say(f"serving {len(models)} exported models behind Triton's batcher ...")
        results = serve(models, Path(workdir) / "served")
    output.mkdir(parents=True, exist_ok=True)
    with open(output / "report.md", "a") as report_file:
        report_file.write("\n".join(["", *report(results, rule)]) + "\n")
    (output / "exported.json").write_text(json.dumps([{**r.__dict__, "rule": rule[r.name]} for r in results], indent=1))
    failed = [r.name for r in results if not r.correct]
    say(
        f"exporters' corpus: {len(results) - len(failed)} of {len(results)} served correctly; failed: {failed or 'none'}"
    )
    return len(failed)


def run_onnx(args: argparse.Namespace, output: Path, started: datetime) -> int:
    """The onnx wheel's test models, screened, served and checked; report.md. How many failed."""
    cases = discover()
    chosen = select(cases, args.pattern, args.limit)
    say(f"{len(chosen)} of {len(cases)} cases from {corpus_root()}; screening with in-process ONNX Runtime ...")
    screened, excluded = [], []
    for outcome in screen(chosen):
        (screened.append(outcome) if isinstance(outcome, Screened) else excluded.append(outcome))
    say(
        f"{len(screened)} run correctly in-process ({len(excluded)} left out); serving them in chunks of {args.chunk_size}"
    )
    with tempfile.TemporaryDirectory(prefix="tritonnx-conformance-") as workdir:
        verdicts = ConformanceRun(screened, Path(workdir), args.chunk_size, say).run()

    facts = summary(verdicts, excluded, len(chosen))
    facts.update(
        date=f"{started:%Y-%m-%d %H:%M} UTC",
        suites=sorted({c.suite for c in chosen}),
        seconds=round((datetime.now(timezone.utc) - started).total_seconds()),
    )
    write_report(output, facts, verdicts, excluded)
    say(
        f"served correctly: {facts['served_correctly']} / {facts['runnable_in_process']} runnable by ONNX Runtime "
        f"({facts['identical_to_in_process']} bit for bit); refused at load: {facts['refused_at_load']}; "
        f"failed: {facts['failed']}"
    )
    for cause, names in facts["failures_by_cause"].items():
        print(f"  {len(names):5d}  {cause}", flush=True)
    return int(facts["failed"])


if __name__ == "__main__":
    sys.exit(main())
