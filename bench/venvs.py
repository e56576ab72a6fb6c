"""Venvs the benchmarks make beside the project's .venv, under build/.

Each peer's framework (bench/peers/venvs.py). Made with an
interpreter found on PATH; pip's output goes to a log whose end an error quotes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class VenvError(RuntimeError):
    """A venv could not be made, or is not what it must be."""


def new_venv(venv: Path, interpreter: str) -> Path:
    """`venv` made afresh (anything there first removed) with `interpreter` from PATH; its Python."""
    found = shutil.which(interpreter)
    if found is None:
        raise VenvError(f"no {interpreter} on PATH to make {venv} with")
    if venv.exists():
        shutil.rmtree(venv)
    made = subprocess.run([found, "-m", "venv", str(venv)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        raise VenvError(f"{found} -m venv {venv} failed: {made.stderr.strip()[-500:]}")
    return venv / "bin" / "python"


def pip_install(venv: Path, args: list[str], log: Path) -> None:
    """`pip install args` in `venv`, its output appended to `log`; VenvError with the log's end when it fails."""
    with open(log, "ab") as output:
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", *args],
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=1800,
            check=False,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise VenvError(
            f"pip install {' '.join(args)} in {venv} failed (exit {done.returncode}); end of {log}:\n{tail}"
        )
