"""Report whether a Triton server and its models are up, and how the models are configured.

Meant both for people (text) and for scripts and probes (--json, and the exit code).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from tritonnx.client.model_control import ControlError, TritonControl, TritonUnreachable
from tritonnx.client.triton_common import URL_HELP_EPILOG, add_connection_args, resolve_url

# Health calls are cheap; a server that needs longer than this to answer one is not healthy.
CALL_TIMEOUT_S = 10.0

EPILOG = f"""\
Exit codes: 0 the server and every requested model are ready, 1 something is not ready,
2 the server cannot be reached (or bad arguments).

Examples:
  python -m tritonnx.client.triton_health
  python -m tritonnx.client.triton_health --model resnet50 --model bert
  python -m tritonnx.client.triton_health --protocol http --url 127.0.0.1:8000 --json

{URL_HELP_EPILOG}
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tritonnx.client.triton_health",
        description="Check a Triton server: liveness, readiness, version and extensions, and for\n"
        "each model its readiness, versions, inputs/outputs and key configuration\n"
        "(max_batch_size, dynamic batching, instance groups).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_connection_args(parser)
    parser.add_argument(
        "--model",
        dest="models",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="model(s) to check (repeatable; default: every model in the repository index)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def summarize_config(config: dict) -> dict[str, Any]:
    """The scheduling part of a model config, the same whichever protocol read it.

    gRPC's omitted defaults are filled in and its string-encoded 64-bit numbers turned back into ints.
    """
    dynamic = config.get("dynamic_batching")  # absent: the model has no dynamic batcher
    summary: dict[str, Any] = {
        "max_batch_size": int(config.get("max_batch_size", 0)),
        "dynamic_batching": None,
        "instance_groups": [
            {
                "name": group.get("name", ""),
                "kind": group.get("kind", "KIND_AUTO"),
                "count": int(group.get("count", 1)),
            }
            for group in config.get("instance_group", [])
        ],
    }
    if dynamic is not None:
        summary["dynamic_batching"] = {
            "preferred_batch_size": [int(b) for b in dynamic.get("preferred_batch_size", [])],
            "max_queue_delay_microseconds": int(dynamic.get("max_queue_delay_microseconds", 0)),
        }
        policy = dynamic.get("default_queue_policy")
        if policy is not None:
            summary["dynamic_batching"]["default_queue_policy"] = {
                "timeout_action": policy.get("timeout_action", "REJECT"),
                "default_timeout_microseconds": int(policy.get("default_timeout_microseconds", 0)),
                "allow_timeout_override": bool(policy.get("allow_timeout_override", False)),
                "max_queue_size": int(policy.get("max_queue_size", 0)),
            }
    return summary


def check_model(client: TritonControl, name: str, index: list[dict]) -> dict[str, Any]:
    """Readiness, versions, metadata and config summary of one model.

    A model that is not loaded has no metadata; the reason goes into `error` instead of failing the whole check.
    """
    versions = [
        {key: entry[key] for key in ("version", "state", "reason") if entry.get(key)}
        for entry in index
        if entry.get("name") == name
    ]
    ready = sorted(int(v["version"]) for v in versions if v.get("state") == "READY" and v["version"].isdigit())
    report: dict[str, Any] = {
        "name": name,
        "ready": client.ready(name),
        "versions": versions,
        # What a request that names no version gets (and whose metadata and config are shown).
        "default_version": str(ready[-1]) if ready else None,
    }
    try:
        metadata = client.metadata(name)
        report.update(
            platform=metadata["platform"],
            inputs=metadata["inputs"],
            outputs=metadata["outputs"],
            config=summarize_config(client.config(name)),
        )
    except TritonUnreachable:
        raise
    except ControlError as exc:
        report["error"] = exc.described()
    return report


def check(client: TritonControl, models: Sequence[str]) -> dict[str, Any]:
    """The whole report; `ok` is what the exit code reflects."""
    live = client.server_live()
    ready = client.server_ready()
    server_metadata = client.server_metadata()
    index = client.index()
    # The index lists one entry per version; keep each model once, in index order.
    names = list(models) or list(dict.fromkeys(entry["name"] for entry in index))
    model_reports = [check_model(client, name, index) for name in names]
    return {
        "url": client.url,
        "protocol": client.protocol,
        "server": {
            "live": live,
            "ready": ready,
            "name": server_metadata.get("name", ""),
            "version": server_metadata.get("version", ""),
            "extensions": list(server_metadata.get("extensions", [])),
        },
        "models": model_reports,
        "ok": live and ready and all(m["ready"] for m in model_reports),
    }


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _tensor_lines(title: str, tensors: list[dict]) -> list[str]:
    return [f"  {title}:"] + [f"    {t['name']}: {t['datatype']} {t['shape']}" for t in tensors]


def _config_lines(config: dict[str, Any]) -> list[str]:
    lines = [f"  max_batch_size: {config['max_batch_size']}"]
    dynamic = config["dynamic_batching"]
    if dynamic is None:
        lines.append("  dynamic_batching: off")
    else:
        text = (
            f"preferred_batch_size {dynamic['preferred_batch_size']}, "
            f"max_queue_delay_microseconds {dynamic['max_queue_delay_microseconds']}"
        )
        policy = dynamic.get("default_queue_policy")
        if policy is not None:
            text += ", default_queue_policy " + ", ".join(f"{k} {v}" for k, v in policy.items())
        lines.append(f"  dynamic_batching: {text}")
    groups = ", ".join(f"{g['name']} {g['count']} x {g['kind']}" for g in config["instance_groups"])
    lines.append(f"  instance_groups: {groups or 'none'}")
    return lines


def format_report(report: dict[str, Any]) -> str:
    server = report["server"]
    lines = [
        f"server {report['url']} ({report['protocol']}): "
        f"live {_yes_no(server['live'])}, ready {_yes_no(server['ready'])}",
        f"  {server['name']} {server['version']}",
        f"  extensions: {', '.join(server['extensions'])}",
    ]
    for model in report["models"]:
        lines.append(f"model {model['name']}: {'ready' if model['ready'] else 'NOT READY'}")
        versions = ", ".join(" ".join(v[key] for key in ("version", "state") if key in v) for v in model["versions"])
        if model["default_version"] is not None and len(model["versions"]) > 1:
            versions += f" (requests without a version: {model['default_version']})"
        lines.append(f"  versions: {versions or 'none in the repository index'}")
        # Load failures carry a multi-line Python traceback; keep it indented under the model. A version
        # swapped out is "unloaded": nothing to explain.
        lines.extend(
            f"  reason ({v.get('version', '-')}): "
            + "\n    ".join(line for line in v["reason"].splitlines() if line.strip())
            for v in model["versions"]
            if v.get("reason", "unloaded") != "unloaded"
        )
        if "error" in model:
            lines.append(f"  error: {model['error']}")
            continue
        lines.append(f"  platform: {model['platform']}")
        lines.extend(_config_lines(model["config"]))
        lines.extend(_tensor_lines("inputs", model["inputs"]))
        lines.extend(_tensor_lines("outputs", model["outputs"]))
    not_ready = [m["name"] for m in report["models"] if not m["ready"]]
    if report["ok"]:
        lines.append(f"OK: server ready, {len(report['models'])} model(s) ready")
    else:
        problems = [] if server["live"] and server["ready"] else ["server not ready"]
        if not_ready:
            problems.append(f"model(s) not ready: {', '.join(not_ready)}")
        lines.append(f"NOT READY: {'; '.join(problems)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    url = resolve_url(args)
    try:
        with TritonControl(url, timeout_s=CALL_TIMEOUT_S, protocol=args.protocol) as client:
            report = check(client, args.models)
    except TritonUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ControlError as exc:  # a server-level call failed: not healthy
        print(f"error: {exc.described()}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
