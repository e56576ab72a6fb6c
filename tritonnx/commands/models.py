"""Publish, list, roll back and retire versions of a served model, with Triton swapping them in place.

The work is done by tritonnx/server/versions.py; this is its command line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from tritonnx.client.model_control import ControlError, TritonControl, TritonUnreachable
from tritonnx.client.triton_common import default_url
from tritonnx.common.admin import known_admin_key
from tritonnx.common.paths import Paths
from tritonnx.offline.quantize import (
    DEFAULT_HOLDOUT_FRACTION,
    DEFAULT_MIN_COSINE,
    DEFAULT_MIN_TOP1,
    MODES,
    REPORT_FILE,
    Limits,
    QuantizationRefused,
    quantize_for_publish,
)
from tritonnx.server.versions import (
    RETIRED,
    ModelFolder,
    Outcome,
    VersionError,
    VersionRow,
    describe_policy,
    list_versions,
    publish,
    retire,
    rollback,
)

PROG = "python -m tritonnx.commands.models"
ENVIRONMENT = """\
Environment:
  TRITONNX_TRITON_URL        Triton's gRPC address without --url (default 127.0.0.1:8001)
  TRITONNX_MODEL_REPOSITORY  the repository without --repository (default: the checkout's model_repository,
                             or $TRITONNX_HOME/model_repository), the one `make serve` / tritonnx-serve serves
  TRITONNX_ADMIN_KEY         the key of Triton's model control, else the one in build/admin-key
                             ($TRITONNX_BUILD_DIR/admin-key) that make serve writes

Exit codes: 0 done, 1 refused or failed (the message says why; what served before still serves),
2 bad arguments or Triton unreachable.
"""

DESCRIPTION = """\
Versions of the models Triton serves from the model repository. Each version is a folder
<model>/<n>/ holding model.onnx (or the config's default_model_filename), and a model.py for a
backend: "python" model; a retired version moves to <model>/retired/<n>/, a version Triton could
not load or whose publish was killed to <model>/failed/<n>/, both of which Triton ignores, and
keeps its number (numbers are never reused). Triton (explicit model control) serves what
config.pbtxt's version_policy selects, by default the newest version alone: a new version loads
beside the serving one, which answers until the new one is ready."""

COMMANDS = {
    "publish": (
        "check an ONNX file and serve it as the model's next version",
        """\
Check FILE (it loads in ONNX Runtime; its inputs, outputs and batching, as the backend will serve
them, fit the served version's: the same names, datatypes and ranks, a fixed input dim may become
dynamic, the served outputs first in their order), write it as version n+1 (through a staging
folder Triton ignores, then one rename), with the newest version's model.py for a backend: "python"
model, and have Triton load it. A file that fails a check is refused before anything is written; one Triton cannot load
is moved to <model>/failed/<n>/. Either way the serving version keeps serving. A publish killed before Triton
reported its version READY leaves it unfinished: the next server start or publish moves it to failed/.

Examples:
  python -m tritonnx.commands.models publish resnet50 path/to/new.onnx
  python -m tritonnx.commands.models publish text_classifier v2.onnx --allow-signature-change

With --quantize static|dynamic, FILE is the FP32 model and its INT8 version is published instead, if
it agrees with FILE on held-out inputs (top-1 agreement >= --min-top1, mean cosine similarity of the
outputs >= --min-cosine); else nothing is published and the command exits 1 saying which measure
failed. static calibrates on --calibration DIR (.npy/.npz arrays, or .jpg/.png images through the
project's image pre-processing), holding out its last 20% unless --holdout DIR is given; dynamic
(for transformers) needs only inputs to check (--holdout or --calibration). The report (agreement,
speed FP32 vs INT8 in-process at batch 1 and the model's batch, the quantizer's settings) is written
beside the version as quantization.json. See docs/versions.md.

  python -m tritonnx.commands.models publish resnet50 model_repository/resnet50/1/model.onnx --quantize static --calibration imgs/
  python -m tritonnx.commands.models publish text_classifier fp32.onnx --quantize dynamic --holdout samples/""",
    ),
    "list": (
        "list the versions on disk and their state in Triton",
        """\
For each model: its version_policy, and every version in the repository ("unfinished": its
publish is under way or was killed), in retired/, in failed/, or known only to Triton ("gone":
Triton keeps the last state of a version removed by hand), with Triton's state (READY,
UNAVAILABLE, LOADING, UNLOADING) and which version serves requests that name none.

Examples:
  python -m tritonnx.commands.models list
  python -m tritonnx.commands.models list resnet50 --json""",
    ),
    "rollback": (
        "retire the newest version so that the previous one serves again",
        """\
Move the newest version to retired/ and have Triton load the model: the previous version loads
(if it is not loaded already) and takes the requests, then the newest is unloaded once its
requests in flight are answered. To serve a retired version again, publish its file:
  python -m tritonnx.commands.models publish resnet50 model_repository/resnet50/retired/3/model.onnx

Example:
  python -m tritonnx.commands.models rollback resnet50""",
    ),
    "check": (
        "say whether a model's requests will be batched, and why, before it is served",
        """\
Read FILE as the backend reads it at load: whether Triton's batcher can stack its requests (every
input and output with a dynamic first dim), what the batch-axis rule finds in the graph (nodes that
mix the rows of a batch, nodes it cannot judge), and, where the rule finds no mixing, the check at
load: a few rows run stacked and one by one in ONNX Runtime. The first line is the verdict, the
lines after it why. No server is needed, and nothing is written.

Example:
  python -m tritonnx.commands.models check path/to/my.onnx""",
    ),
    "retire": (
        "take one version out of service and out of the repository",
        """\
Move version VERSION to retired/ and have Triton unload it. Refused when it is the only version
serving (use rollback to serve the previous version instead), when config.pbtxt's version_policy
names it (specific), or when nothing would be left to serve.

Example:
  python -m tritonnx.commands.models retire resnet50 2""",
    ),
}


def _host_port(value: str) -> str:
    if "://" in value:
        raise argparse.ArgumentTypeError(f"give host:port without a scheme, not {value!r}")
    return value


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"a version is a number from 1, not {value!r}")
    return int(value)


def _fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"a fraction from 0 to 1, not {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", type=_host_port, metavar="HOST:PORT", help="Triton's gRPC address (default: $TRITONNX_TRITON_URL)"
    )
    common.add_argument(
        "--repository",
        type=Path,
        metavar="DIR",
        help="the model repository Triton serves (default: $TRITONNX_MODEL_REPOSITORY, see below)",
    )
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=ENVIRONMENT, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {
        name: commands.add_parser(
            name,
            parents=[common],
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}.\n\n{details}",
            epilog=ENVIRONMENT,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for name, (summary, details) in COMMANDS.items()
    }
    parsers["publish"].add_argument("model", metavar="MODEL", help="the model's name (its folder in the repository)")
    parsers["publish"].add_argument("file", metavar="FILE", type=Path, help="the new version's .onnx file")
    parsers["publish"].add_argument(
        "--allow-signature-change",
        action="store_true",
        help="publish even if inputs, outputs or batching differ from the served version's",
    )
    quantizing = parsers["publish"].add_argument_group("INT8 versions (docs/versions.md)")
    quantizing.add_argument("--quantize", choices=MODES, help="publish FILE's INT8 version, made by ONNX Runtime")
    quantizing.add_argument("--calibration", type=Path, metavar="DIR", help="sample inputs to calibrate on")
    quantizing.add_argument("--holdout", type=Path, metavar="DIR", help="sample inputs the gate checks (default: "
                            "the last --holdout-fraction of --calibration's)")  # fmt: skip
    quantizing.add_argument("--holdout-fraction", type=_fraction, default=DEFAULT_HOLDOUT_FRACTION, metavar="F",
                            help="default: %(default)s")  # fmt: skip
    quantizing.add_argument("--min-top1", type=_fraction, default=DEFAULT_MIN_TOP1, metavar="F",
                            help="top-1 agreement required, 0-1 (default: %(default)s)")  # fmt: skip
    quantizing.add_argument("--min-cosine", type=_fraction, default=DEFAULT_MIN_COSINE, metavar="F",
                            help="mean cosine similarity required, 0-1 (default: %(default)s)")  # fmt: skip
    parsers["list"].add_argument("models", nargs="*", metavar="MODEL", help="models to list (default: all)")
    parsers["list"].add_argument("--json", action="store_true", help="print one JSON document")
    parsers["rollback"].add_argument("model", metavar="MODEL", help="the model's name")
    parsers["check"].add_argument("file", metavar="FILE", type=Path, help="the .onnx file")
    parsers["check"].add_argument("--max-batch-size", type=_positive_int, default=8, metavar="N",
                                  help="the batch the check stacks up to (default: %(default)s)")  # fmt: skip
    parsers["retire"].add_argument("model", metavar="MODEL", help="the model's name")
    parsers["retire"].add_argument("version", metavar="VERSION", type=_positive_int, help="the version to retire")
    return parser


def _log(message: str) -> None:
    print(message, flush=True)


def _summary(action: str, outcome: Outcome) -> str:
    return f"{action}; {outcome.serving}"


def _format_rows(folder: ModelFolder, rows: list[VersionRow]) -> str:
    lines = [f"{folder.name}: version_policy {describe_policy(folder.version_policy())} ({folder.path})"]
    lines.append(f"  {'version':<8} {'where':<11} Triton")
    for row in rows:
        state = row.state or "-"
        if row.reason:
            state += f": {row.reason.splitlines()[0]}"
        marker = "  <- serves requests without a version" if row.default else ""
        lines.append(f"  {row.version:<8} {row.place:<11} {state}{marker}")
    if not rows:
        lines.append("  no versions")
    return "\n".join(lines)


def _serving_now(folder: ModelFolder, control: TritonControl) -> str:
    ready = [row.version for row in list_versions(folder, control) if row.state == "READY"]
    return (
        f"{folder.name} serves version{'s' if len(ready) > 1 else ''} {', '.join(map(str, ready)) or 'none'} as before"
    )


def run(args: argparse.Namespace, control: TritonControl, repository: Path, out: Callable[[str], None]) -> None:
    """The command; VersionError or ControlError when refused or failed."""
    if args.command == "list":
        names = args.models or sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))
        folders = [ModelFolder.find(repository, name) for name in names]
        listed = [(folder, list_versions(folder, control)) for folder in folders]
        if args.json:
            document = {
                "repository": str(repository),
                "models": [
                    {
                        "name": folder.name,
                        "version_policy": describe_policy(folder.version_policy()),
                        "versions": [row.__dict__ for row in rows],
                    }
                    for folder, rows in listed
                ],
            }
            out(json.dumps(document, indent=2))
        else:
            out("\n".join(_format_rows(folder, rows) for folder, rows in listed))
        return
    folder = ModelFolder.find(repository, args.model)
    if args.command == "publish" and args.quantize:
        config = control.served_config(folder.name) or folder.config()
        limits = Limits(args.min_top1, args.min_cosine)
        with tempfile.TemporaryDirectory(prefix="tritonnx-quantize-") as workdir:
            try:
                int8_file, report = quantize_for_publish(args.file, config, args.quantize, args.calibration,
                                                         args.holdout, Path(workdir), limits, args.holdout_fraction,
                                                         _log)  # fmt: skip
            except QuantizationRefused as refused:
                raise VersionError(f"{refused}; nothing was published, {_serving_now(folder, control)}") from None
            report_text = json.dumps(report, indent=2) + "\n"
            outcome = publish(folder, int8_file, control, args.allow_signature_change, _log, {REPORT_FILE: report_text})
        speeds = ", ".join(f"batch {r['batch']} {r['speedup']:.2f}x" for r in report["speed"]["runs"])
        out(_summary(f"published the {args.quantize} INT8 version of {args.file} as version {outcome.version} of "
                     f"{folder.name} (in-process speed over FP32: {speeds}; report: {REPORT_FILE} in the version's "
                     "folder)", outcome))  # fmt: skip
    elif args.command == "publish":
        if args.calibration or args.holdout:
            raise VersionError("--calibration and --holdout feed --quantize: name static or dynamic")
        outcome = publish(folder, args.file, control, args.allow_signature_change, _log)
        out(_summary(f"published {args.file} as version {outcome.version} of {folder.name}", outcome))
    elif args.command == "rollback":
        outcome = rollback(folder, control)
        out(_summary(f"rolled back: version {outcome.version} retired to {RETIRED}/{outcome.version}", outcome))
    else:
        outcome = retire(folder, args.version, control)
        out(_summary(f"version {outcome.version} of {folder.name} retired to {RETIRED}/{outcome.version}", outcome))


def check(onnx_file: Path, max_batch_size: int, out: Callable[[str], None]) -> None:
    """The verdict on `onnx_file`'s batching as an instance would reach it at load, then why, line by line."""
    import onnxruntime as ort

    from tritonnx.backend.errors import ModelConfigError
    from tritonnx.backend.onnx_io import read_graph_io
    from tritonnx.backend.runner import OnnxModelRunner
    from tritonnx.backend.settings import SessionSettings

    try:
        graph = read_graph_io(onnx_file)
    except (OSError, ModelConfigError) as error:
        raise VersionError(f"{onnx_file}: {error}") from None
    reason = graph.cannot_batch()
    if reason:
        out(f"{onnx_file}: no batching: {reason}, so Triton hands it each request's tensors whole (max_batch_size 0)")
        return
    found: list[str] = []
    ort.set_default_logger_severity(4)  # a run the check's values fail is said below, not on stderr
    settings = SessionSettings.from_model_config({"parameters": {"optimized_model_cache": {"string_value": "0"}}})
    try:
        runner = OnnxModelRunner.load(onnx_file, onnx_file.stem, settings, max_batch_size, log=found.append,
                                      graph=graph)  # fmt: skip
    except Exception as error:  # noqa: BLE001 - ONNX Runtime's own errors: the file does not load
        raise VersionError(f"{onnx_file}: ONNX Runtime cannot load it: {error}") from None
    out(f"{onnx_file}: {runner.batching}")
    for line in found:
        out(f"  {line.split(': ', 1)[-1]}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "check":
        try:
            check(args.file, args.max_batch_size, print)
        except VersionError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    paths = Paths.from_environment()
    repository = args.repository or paths.model_repository
    control = TritonControl(args.url or default_url("grpc"), known_admin_key(paths))
    error = partial(print, file=sys.stderr)
    try:
        run(args, control, repository, print)
    except TritonUnreachable as exc:
        error(f"error: {exc}; nothing was changed")
        return 2
    except (VersionError, ControlError) as exc:
        error(f"error: {exc}")
        return 1
    finally:
        control.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
