"""The exporters' corpus: models exported as users export them, served behind Triton's batcher, every answer checked.

`export_models.py` runs in a venv of its own (torch, torchvision, transformers and timm are not the project's
dependencies): `exporters_python` makes it once under the build folder from `requirements-exporters.txt`.
`serve` puts each exported model in a repository in the native backend's style, sends bursts of concurrent requests
of different rows, and compares every answer with in-process ONNX Runtime on that request alone: a model whose rows
are independent must be merged by Triton's batcher and run batched (the instance's ready line says "batches"), and
still answer each request as alone; a model without a batch dim is served whole and exactly.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient

from tests.kserve import execution_counts, infer_concurrently
from tritonnx.backend.runner import rows_agree
from tritonnx.server.stack import ServingStack

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "requirements-exporters.txt"
EXPORTER = HERE / "export_models.py"
# The CI slice, exported once by export_models.py with requirements-exporters.txt and kept in git: the transformers
# and timm exports that lost batching to the rule's false positives, and torchvision's ViT. CI serves these files
# without the exporters' venv (PyPI's torch for x86_64 is a CUDA build, several GB). To export them again:
#   build/exporters-venv/bin/python tests/conformance/export_models.py tests/conformance/exports hf_bert ...
EXPORTS = HERE / "exports"
SLICE = ("hf_bert", "hf_distilbert", "hf_vit", "tv_vit", "timm_mobilevit")
# What the exporters' venv takes under the build folder, with pip's downloads: torch 2.14.1 and its CUDA libraries.
VENV_DISK_BYTES = 9 * 2**30
ONE_THREAD = 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
BATCHING = (
    'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 300000 }\n'
    f"instance_group [{{ count: 1, kind: KIND_CPU }}]\n{ONE_THREAD}"
)
WHOLE = f'platform: "onnxruntime_onnx"\ninstance_group [{{ count: 1, kind: KIND_CPU }}]\n{ONE_THREAD}'
SIZES = (1, 2, 1)  # the rows of each request of a burst: the four rows of rows.npz
BURSTS = 5  # at most, until Triton merges the requests of one burst


def exporters_python(build: Path, say: Callable[[str], None]) -> Path:
    """The exporters' interpreter: a venv under `build`, made (or remade, when the requirements change) from
    requirements-exporters.txt with pip, as a clean clone makes it."""
    venv = build / "exporters-venv"
    python = venv / "bin" / "python"
    stamp = venv / "requirements.sha256"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    free = shutil.disk_usage(build if build.exists() else build.parent).free
    if free < VENV_DISK_BYTES:
        raise OSError(
            f"the exporters' venv needs about {VENV_DISK_BYTES / 2**30:.0f} GB free under {build} (torch from PyPI is "
            f"a CUDA build), and {free / 2**30:.1f} GB are: free some space, or serve the slice kept in git, "
            f"{EXPORTS.relative_to(HERE.parent.parent)}, with `make test-conformance`"
        )
    say(f"installing the exporters' venv in {venv} (torch, torchvision, transformers, timm: a few minutes, once)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        # --no-compile: byte-compiling torch's files is most of an install's time, and each import does its own.
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            "--disable-pip-version-check",
            "-r",
            str(REQUIREMENTS),
        ],  # fmt: skip
        check=True,
    )
    stamp.write_text(wanted)
    return python


@dataclass(frozen=True)
class Exported:
    """One exported model: its file, the rows a user would send, and what it should do behind the batcher."""

    name: str
    onnx_file: Path
    rows: dict[str, np.ndarray]
    outputs: list[str]
    batches: bool  # False: no batch dim, served whole


def export(python: Path, names: list[str], out: Path) -> list[Exported]:
    """Export `names` (all when empty) into `out` with the exporters' interpreter."""
    subprocess.run([str(python), str(EXPORTER), str(out), *names], check=True, capture_output=True, text=True)
    return exported_in(out, names)


def exported_in(out: Path, names: list[str]) -> list[Exported]:
    """The models export_models.py wrote into `out`: `names`, or all when empty."""
    found = []
    for folder in sorted(p for p in out.iterdir() if (p / "expect.json").exists() and (not names or p.name in names)):
        expect = json.loads((folder / "expect.json").read_text())
        rows = dict(np.load(folder / "rows.npz"))
        found.append(Exported(folder.name, folder / "model.onnx", rows, expect["outputs"], expect["expect"] != "whole"))
    return found


@dataclass
class Served:
    """What serving one exported model showed."""

    name: str
    batches: bool
    answers_as_alone: bool = False
    merged: bool = False  # Triton's batcher ran requests of one burst together
    verdict: str = ""  # the instance's batching verdict, from its ready line
    problems: list[str] = field(default_factory=list)

    @property
    def correct(self) -> bool:
        expected = self.verdict.startswith("batches") and self.merged if self.batches else True
        return self.answers_as_alone and expected and not self.problems


def _alone(session: ort.InferenceSession, outputs: list[str], request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip(outputs, session.run(outputs, request), strict=True))


def _check(served: Served, answer: dict[str, np.ndarray] | None, expected: dict[str, np.ndarray]) -> None:
    if answer is None:
        served.problems.append("a request failed")
        return
    differs = rows_agree(answer, [expected]) if served.batches else None
    if not served.batches:  # one request, one run: the same kernels, one thread each, the same bits
        differs = next((n for n in expected if not np.array_equal(answer[n], expected[n])), None)
    if differs:
        served.problems.append(f"an answer differs from in-process ONNX Runtime alone: {differs}")


def _serve_one(stack: ServingStack, client: grpcclient.InferenceServerClient, model: Exported) -> Served:
    served = Served(model.name, model.batches)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model.onnx_file), options, providers=["CPUExecutionProvider"])
    if not model.batches:
        [outcome] = infer_concurrently(client, model.name, [model.rows], model.outputs)
        _check(served, outcome.outputs, _alone(session, model.outputs, model.rows))
        served.answers_as_alone = not served.problems
        return served
    starts = np.cumsum((0, *SIZES))
    requests: list[Mapping[str, np.ndarray]] = [
        {n: a[s:e] for n, a in model.rows.items()} for s, e in zip(starts, starts[1:], strict=False)
    ]
    headers = stack.triton.admin_headers
    for _ in range(BURSTS):
        before = execution_counts(client, model.name, headers)
        outcomes = infer_concurrently(client, model.name, requests, model.outputs)
        for request, outcome in zip(requests, outcomes, strict=True):
            _check(served, outcome.outputs, _alone(session, model.outputs, dict(request)))
        inferences, executions = execution_counts(client, model.name, headers, at_least=before[0] + sum(SIZES))
        if executions - before[1] < len(SIZES):
            served.merged = True
            break
    served.answers_as_alone = not served.problems
    return served


def serve(exported: list[Exported], workdir: Path) -> list[Served]:
    """Serve every exported model at once, each with its own instance, and judge what each answer shows."""
    repository = workdir / "repository"
    for model in exported:
        (repository / model.name / "1").mkdir(parents=True, exist_ok=True)
        (repository / model.name / "1" / "model.onnx").write_bytes(model.onnx_file.read_bytes())
        (repository / model.name / "config.pbtxt").write_text(BATCHING if model.batches else WHOLE)
    results = []
    with ServingStack(repository, workdir, with_facade=False, triton_http=False) as stack:
        with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
            results = [_serve_one(stack, client, model) for model in exported]
        log = stack.triton.log_file.read_text(errors="replace") if stack.triton.log_file else ""
    for served in results:
        found = re.search(rf"{re.escape(served.name)} instance \S+ ready in .*?max_batch_size=\d+ \(([^)]*\)?)\)", log)
        served.verdict = found.group(1) if found else "no ready line"
    return results


def report(results: list[Served], rule: dict[str, str]) -> list[str]:
    """The corpus's lines of report.md: each model, the rule's verdict on it, and what serving it showed."""
    lines = [
        "## The exporters' corpus: torch.onnx.export of transformers, torchvision and timm",
        "",
        f"{sum(r.correct for r in results)} of {len(results)} served correctly: every request answered as in-process "
        "ONNX Runtime alone; each model with a batch dim merged by Triton's batcher and run batched.",
        "",
        "| model | the batch-axis rule | served | answers as alone | merged |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.name} | {rule.get(r.name, '')} | {r.verdict} | {r.answers_as_alone} | "
                     f"{r.merged if r.batches else 'no batch dim'} |")  # fmt: skip
    return lines


def rule_verdict(onnx_file: Path) -> str:
    """What the batch-axis rule alone says of a graph: coupled, undecided or independent."""
    from tritonnx.backend.onnx_io import read_graph_io

    graph = read_graph_io(onnx_file)
    return "coupled" if graph.batch_coupling() else "undecided" if graph.batch_undecided() else "independent"
