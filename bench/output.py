"""Where a measurement run writes, and what it says meanwhile: one way for every command."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from bench import RESULTS

CORES = len(os.sched_getaffinity(0))


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_folder(out: Path | None, kind: str) -> tuple[str, Path]:
    """The run's UTC start stamp, and its folder (created): `out`, or bench/results/<stamp>-<kind>."""
    started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    folder = out or RESULTS / f"{started}-{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    return started, folder


def machine() -> str:
    return f"{platform.machine()}, {CORES} cores, {platform.platform()}, Python {platform.python_version()}"


def settings(args: argparse.Namespace) -> dict:
    """The command's arguments as results.json keeps them (paths as text)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))
