"""python -m bench.studies.openvino: ONNX Runtime's OpenVINO execution provider, served through Triton.

`optimization { execution_accelerators { cpu_execution_accelerator: [{ name: "openvino" }] } }` puts
OpenVINO first in every instance's session (backend/settings.py) where the installed ONNX Runtime has
that provider: the `onnxruntime-openvino` wheel, which installs its own `onnxruntime` module and so
cannot share the project's venv. This study makes a venv of its own on first use
(build/openvino-venv: the serving requirements with onnxruntime-openvino in place of onnxruntime,
tritonserver's wheel and this checkout, both without their requirements) and serves from it: its
`bin/` goes first on tritonserver's PATH, so the Python stubs run its packages.

For each round, two tritonservers in turn, on free loopback ports, serving `--models` with their
own config.pbtxt (the same policy: instances, threads, batching), once without the accelerator
(the CPU provider) and once with it; the order alternates between rounds so that the machine's
drift falls on both. Against each, the project's load engine (bench/load) runs a closed loop of
single-image requests at each of `--concurrency` for `--seconds` after `--warmup`, Triton's
KServe gRPC directly. Both arms run the same onnxruntime build (the venv's), so only the provider
differs.

Every answer, warm-up included, is compared with in-process ONNX Runtime (the CPU provider, in this
process's venv) within rtol 1e-4 and atol 1e-4 x the largest expected magnitude
(bench.load.targets.close_enough). Each instance writes its session's providers and onnxruntime
version into tritonserver's log when it is ready (backend/triton_model.py): that is how the study
sees what ran inside the stubs.

Gates (exit 1 when one fails, named in the report): the stubs ran the venv's onnxruntime, OpenVINO
first in every instance that asked for it and the CPU provider alone in the others; every answer
agrees; no call failed; and whether OpenVINO wins: at least WIN_RATIO x the CPU provider's
throughput at c=WIN_CONCURRENCY on WIN_MODEL (median of the rounds). The other ratios are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import onnxruntime as ort
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from backend.server.repository import link_models, read_config
from backend.server.stack import ServingStack
from backend.session_cache import CACHE_DIR_ENV, CPU_PROVIDER
from backend.settings import OPENVINO, OPENVINO_PROVIDER, OPENVINO_WHEEL, cpu_instance_count
from bench import REPOSITORY
from bench.load.loops import LoadResult, run_load
from bench.load.targets import KServeTarget
from bench.output import Gate, finish, gates_section, machine, run_folder, say, settings, write_json
from bench.overload import checked_images
from bench.studies.arms import Run, ratios
from bench.venvs import VenvError, new_venv, pip_install

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "build" / "openvino-venv"
OPENVINO_PIN = f"{OPENVINO_WHEEL}==1.24.1"
# The interpreter the venv is made with (OPENVINO_PYTHON to change it): the stub's minor version, 3.11.
DEFAULT_PYTHON = os.environ.get("OPENVINO_PYTHON", "python3.11")
SERVING = ROOT / "requirements-serving.txt"
TRITON = ROOT / "requirements-triton.txt"
CONSTRAINTS = ROOT / "deploy" / "docker" / "requirements-image.txt"  # the transitive pins, as `make venv` uses them
MODELS = ("mobilenet_v3_small", "resnet50")
ARMS = ("cpu", OPENVINO)
WIN_MODEL, WIN_CONCURRENCY, WIN_RATIO = "mobilenet_v3_small", 1, 1.1
TOLERANCE = "rtol 1e-4, atol 1e-4 x the largest expected magnitude"
_ONNXRUNTIME = re.compile(r"^onnxruntime\s*(==|>=|<=|~=|$)")
# backend/triton_model.py's line, once per instance: "<model> instance <name> ready in ... providers=A,B (onnxruntime V)"
_READY = re.compile(r'([^\s"]+) instance (\S+) ready in .* providers=(\S+) \(onnxruntime ([^\s)]+)\)')


# The venv ------------------------------------------------------------------------------------------------------------


def venv_requirements() -> str:
    """requirements-serving.txt with onnxruntime replaced by onnxruntime-openvino."""
    lines = [OPENVINO_PIN if _ONNXRUNTIME.match(line.strip()) else line for line in SERVING.read_text().splitlines()]
    if OPENVINO_PIN not in lines:
        raise VenvError(f"{SERVING} pins no onnxruntime to replace with {OPENVINO_PIN}")
    return "\n".join(lines) + "\n"


def venv_stamp(interpreter: str) -> str:
    """What the venv is made from: requirements, constraints, tritonserver's pin, this checkout, the interpreter."""
    made_from = [venv_requirements().encode(), CONSTRAINTS.read_bytes(), TRITON.read_bytes(),
                 (ROOT / "pyproject.toml").read_bytes(), str(ROOT).encode(), interpreter.encode()]  # fmt: skip
    return hashlib.sha256(b"\0".join(made_from)).hexdigest()


def ensure_venv(venv: Path = VENV, interpreter: str = DEFAULT_PYTHON, log: Callable[[str], None] = say) -> str:
    """Make the venv when it is missing or out of date; its onnxruntime's version, checked to have OpenVINO."""
    stamp_file = venv / ".installed"
    if not (stamp_file.exists() and stamp_file.read_text() == venv_stamp(interpreter)):
        if venv.exists() and venv != VENV and not stamp_file.exists():
            raise VenvError(f"{venv} exists and was not made by this study: name a new folder or remove it")
        log(f"making {venv} with {interpreter} (OPENVINO_PYTHON names another; first run: about 150 MB of downloads)")
        new_venv(venv, interpreter)
        pip_log, wanted = venv / "pip.log", venv / "requirements.txt"
        wanted.write_text(venv_requirements())
        log(f"installing {SERVING.name} with {OPENVINO_PIN} in place of onnxruntime (pip's log: {pip_log})")
        pip_install(venv, ["-r", str(wanted), "-c", str(CONSTRAINTS)], pip_log)
        log(f"installing tritonserver's wheel ({TRITON.name}) without its requirements")
        pip_install(venv, ["--no-deps", "-r", str(TRITON)], pip_log)
        log(f"installing this checkout ({ROOT}) editable, without its requirements")
        pip_install(venv, ["--no-deps", "-e", str(ROOT)], pip_log)
        stamp_file.write_text(venv_stamp(interpreter))
    asked = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import onnxruntime as o, backend; print(o.__version__, ','.join(o.get_available_providers()), "
         "backend.__file__, sep='\\n')"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if asked.returncode != 0:
        raise VenvError(f"{venv}: onnxruntime or backend does not import: {asked.stderr.strip()[-800:]}")
    version, providers, backend_file = asked.stdout.splitlines()[-3:]
    if OPENVINO_PROVIDER not in providers.split(","):
        raise VenvError(f"{venv}: onnxruntime {version} offers {providers}, no {OPENVINO_PROVIDER}")
    if Path(backend_file).resolve().parents[1] != ROOT:
        raise VenvError(f"{venv} imports backend from {backend_file}, not from this checkout ({ROOT}): remove the venv")
    log(f"{venv}: onnxruntime {version} ({providers}), backend from {backend_file}")
    return version


# The measurement -----------------------------------------------------------------------------------------------------


def config_text(model_dir: Path, accelerated: bool) -> str:
    """The model's config.pbtxt as Triton reads it, with the OpenVINO accelerator added when `accelerated`."""
    config = read_config(model_dir)
    if accelerated:
        accelerators = config.setdefault("optimization", {}).setdefault("execution_accelerators", {})
        accelerators["cpu_execution_accelerator"] = [{"name": OPENVINO}]
    return text_format.MessageToString(json_format.ParseDict(config, model_config_pb2.ModelConfig()))


@dataclass
class Instance:
    arm: str
    round: int
    model: str
    name: str
    providers: list[str]
    onnxruntime: str


def ready_instances(log_text: str, arm: str, round_: int) -> list[Instance]:
    """The instances' own words on their sessions, from tritonserver's log."""
    return [
        Instance(arm, round_, m.group(1), m.group(2), m.group(3).split(","), m.group(4))
        for m in _READY.finditer(log_text)
    ]


async def _measure(
    url: str, model: str, concurrency: int, images: list, expected: list, args: argparse.Namespace
) -> tuple[LoadResult, int]:
    target = KServeTarget(url, model, 1, images=images, expected=expected)
    result = await run_load(target, concurrency, args.seconds, args.warmup)
    return result, target.wrong


def one_stack(
    arm: str, round_: int, references: dict, venv: Path, scratch: Path, out: Path, args: argparse.Namespace
) -> tuple[list[Instance], list[Run]]:
    """One tritonserver serving the models with (or without) the accelerator: its instances and runs.

    The server's repository, backends and cache live in `scratch`; its log is kept in `out`.
    """
    workdir = scratch / f"round{round_}-{arm}"
    configs = {m: config_text(REPOSITORY / m, arm == OPENVINO) for m in args.models}
    repository = link_models(workdir / "repository", {m: REPOSITORY / m for m in args.models}, configs)
    runs: list[Run] = []
    say(f"round {round_}, {arm}: starting tritonserver, its stubs in {venv}")
    stack = ServingStack(repository, workdir, with_facade=False, stub_venv=venv,
                         triton_env={CACHE_DIR_ENV: str(scratch / "ort-cache")})  # fmt: skip
    with stack:
        assert stack.triton.log_file is not None
        instances = ready_instances(stack.triton.log_file.read_text(errors="replace"), arm, round_)
        for model in args.models:
            images, expected = references[model]
            for concurrency in args.concurrency:
                result, wrong = asyncio.run(_measure(stack.triton.grpc_url, model, concurrency, images, expected, args))
                checked = result.requests + result.warmup_requests
                run = Run(arm, round_, model, concurrency, result.throughput_rps, result.p50_ms, result.p99_ms,
                          result.requests, checked, wrong, result.errors)  # fmt: skip
                say(f"round {round_}, {arm}, {model} c={concurrency}: {run.throughput_rps:.1f} req/s, "
                    f"p50 {run.p50_ms:.1f} ms, p99 {run.p99_ms:.1f} ms, {wrong} of {checked} answers unlike "
                    f"in-process, errors {run.errors or 'none'}")  # fmt: skip
                runs.append(run)
    shutil.copyfile(workdir / "tritonserver.log", out / f"round{round_}-{arm}-tritonserver.log")
    return instances, runs


def gates(instances: list[Instance], runs: list[Run], expected_instances: dict[str, int], version: str,
          found: dict[tuple[str, int], dict[str, float]]) -> list[Gate]:  # fmt: skip
    def right(i: Instance) -> bool:
        providers = [OPENVINO_PROVIDER, CPU_PROVIDER] if i.arm == OPENVINO else [CPU_PROVIDER]
        return i.providers == providers and i.onnxruntime == version

    stacks = {(r.arm, r.round) for r in runs}
    counted = {(arm, round_, model): 0 for arm, round_ in stacks for model in expected_instances}
    for i in instances:
        counted[(i.arm, i.round, i.model)] = counted.get((i.arm, i.round, i.model), 0) + 1
    missing = [f"{arm} round {round_} {model}: {n} of {expected_instances.get(model, 0)} instances ready"
               for (arm, round_, model), n in counted.items() if n != expected_instances.get(model, 0)]  # fmt: skip
    wrong_stubs = [f"{i.arm} round {i.round} {i.name}: {','.join(i.providers)} ({i.onnxruntime})"
                   for i in instances if not right(i)]  # fmt: skip
    wrong = sum(r.wrong for r in runs)
    win = found.get((WIN_MODEL, WIN_CONCURRENCY))
    return [
        Gate(f"the stubs ran onnxruntime {version} of the venv: {OPENVINO_PROVIDER} first in every instance with the "
             f"accelerator, {CPU_PROVIDER} alone in the others", bool(instances) and not missing and not wrong_stubs,
             f"{len(instances)} instances; " + ("; ".join(missing + wrong_stubs) or "all as configured")),
        Gate(f"every answer agrees with in-process ONNX Runtime's CPU provider ({TOLERANCE})", wrong == 0,
             f"{wrong} of {sum(r.answers_checked for r in runs)} answers differed"),
        Gate("no call failed", not any(r.errors for r in runs),
             str([f"{r.arm} {r.model} c={r.concurrency}: {r.errors}" for r in runs if r.errors] or "none")),
        Gate(f"OpenVINO wins: >= {WIN_RATIO}x the CPU provider's throughput at c={WIN_CONCURRENCY} on {WIN_MODEL}",
             win is not None and win["throughput"] >= WIN_RATIO,
             f"{win['throughput']:.2f}x (median of the rounds)" if win else "not measured in this run"),
    ]  # fmt: skip


def report(runs: list[Run], found: dict, instances: list[Instance], version: str, args: argparse.Namespace) -> str:
    lines = [
        f"# OpenVINO execution provider through Triton: {', '.join(args.models)}, c={args.concurrency}, "
        f"{args.seconds:g} s windows, {args.rounds} round(s)\n",
        f"Machine: {machine()}. Stubs: {OPENVINO_PIN} (onnxruntime {version}) from {args.venv}, both "
        f"arms; `cpu` is each model's config.pbtxt as it is, `{OPENVINO}` the same with "
        f'`cpu_execution_accelerator: [{{ name: "{OPENVINO}" }}]`. Single-image requests to Triton\'s KServe gRPC; '
        f"every answer compared with in-process ONNX Runtime {ort.__version__} (CPU provider), {TOLERANCE}.\n",
        "| model | c | round | arm | req/s | p50 ms | p99 ms | requests | answers checked | unlike in-process | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r.model} | {r.concurrency} | {r.round} | {r.arm} | {r.throughput_rps:.1f} | {r.p50_ms:.1f} | "
            f"{r.p99_ms:.1f} | {r.requests} | {r.answers_checked} | {r.wrong} | {r.errors or 'none'} |"
            for r in sorted(runs, key=lambda r: (r.model, r.concurrency, r.round, r.arm))
        ),
        "",
        "## OpenVINO against the CPU provider\n",
        "Medians over the rounds of each round's ratio (above 1: OpenVINO better).\n",
        "| model | c | throughput OpenVINO / CPU | p50 CPU / OpenVINO |",
        "|---|---|---|---|",
        *(f"| {m} | {c} | {v['throughput']:.2f}x | {v['p50']:.2f}x |" for (m, c), v in sorted(found.items())),
        "",
        "## What ran in the stubs\n",
        "Each instance's session, as it wrote it into tritonserver's log when ready.\n",
        "| round | arm | model | instance | providers | onnxruntime |",
        "|---|---|---|---|---|---|",
        *(
            f"| {i.round} | {i.arm} | {i.model} | {i.name} | {', '.join(i.providers)} | {i.onnxruntime} |"
            for i in sorted(instances, key=lambda i: (i.round, i.arm, i.model, i.name))
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.openvino",
        description="Throughput and p50 through tritonserver with ONNX Runtime's OpenVINO execution provider "
        f"against the CPU provider, the stubs in a venv with {OPENVINO_PIN} (build/openvino-venv, made on first run).",
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS, help="default: both")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16], help="default: %(default)s")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured per run; default: %(default)s")
    parser.add_argument("--warmup", type=float, default=3.0, help="per run, not measured; default: %(default)s")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the arms' order alternating; default: 2")
    parser.add_argument("--venv", type=Path, default=VENV, help="default: build/openvino-venv of this checkout")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-openvino")
    args = parser.parse_args(argv)
    missing = [m for m in args.models if not (REPOSITORY / m / "1" / "model.onnx").is_file()]
    if missing:
        raise SystemExit(f"no model.onnx for {', '.join(missing)} in {REPOSITORY}: run `make models` first")
    _, out = run_folder(args.out, "openvino")
    args.venv = args.venv.resolve()
    version = ensure_venv(args.venv)
    say(f"in-process reference answers (onnxruntime {ort.__version__}, CPU provider)")
    references = {m: checked_images(m, count=8) for m in args.models}
    instances: list[Instance] = []
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="tritonnx-openvino-") as scratch:
        for round_ in range(1, args.rounds + 1):
            for arm in ARMS if round_ % 2 else tuple(reversed(ARMS)):
                found_instances, found_runs = one_stack(arm, round_, references, args.venv, Path(scratch), out, args)
                instances += found_instances
                runs += found_runs
    found = ratios(runs, "cpu", OPENVINO)
    expected_instances = {m: cpu_instance_count(read_config(REPOSITORY / m)) for m in args.models}
    judged = gates(instances, runs, expected_instances, version, found)
    write_json(out / "results.json", {
        "settings": settings(args), "machine": machine(), "venv_onnxruntime": version,
        "reference_onnxruntime": ort.__version__, "tolerance": TOLERANCE, "runs": [asdict(r) for r in runs],
        "ratios": [{"model": m, "concurrency": c, **v} for (m, c), v in sorted(found.items())],
        "instances": [asdict(i) for i in instances], "gates": [asdict(g) for g in judged],
    })  # fmt: skip
    text = report(runs, found, instances, version, args) + "\n" + gates_section(judged)
    return finish(out, text, judged)


if __name__ == "__main__":
    sys.exit(main())
