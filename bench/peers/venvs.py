"""The peers' venvs under build/peers/<peer>/, made from their pinned requirements files with an interpreter on PATH.

A venv is (re)built when its requirements file or interpreter changes (a stamp holds their hash), so `make
bench-peers` downloads only the first time; pip's output goes to a log whose end an error quotes. This checkout is
installed in it too, editable and without its dependencies: a peer imports `bench.peers.common`, which takes its dtype
table from `tritonnx.backend`, a folder the package maps into its namespace only when installed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS = Path(__file__).resolve().parent
BUILD = ROOT / "build" / "peers"
# The interpreter the venvs are made with (PEERS_PYTHON to change it); a peer may need its own.
DEFAULT_PYTHON = os.environ.get("PEERS_PYTHON", "python3.11")


class VenvError(RuntimeError):
    """A venv could not be made, or is not what it must be."""


def requirements(peer: str) -> Path:
    return PEERS / peer / "requirements.txt"


def python_of(peer: str) -> Path:
    return BUILD / peer / "bin" / "python"


def stamp(peer: str, interpreter: str) -> str:
    """What the venv was built from: the requirements file's hash, the interpreter and the checkout's packaging."""
    made_from = requirements(peer).read_bytes() + interpreter.encode() + (ROOT / "pyproject.toml").read_bytes()
    return hashlib.sha256(made_from).hexdigest()


def ensure(peer: str, interpreter: str = DEFAULT_PYTHON, say: Callable[[str], None] = print) -> Path:
    """The peer's venv Python, after building the venv afresh if its requirements changed; pip's log in the venv."""
    venv, installed = BUILD / peer, BUILD / peer / ".installed"
    if python_of(peer).exists() and installed.exists() and installed.read_text() == stamp(peer, interpreter):
        return python_of(peer)
    say(f"{peer}: making {venv} with {interpreter} from {requirements(peer).relative_to(ROOT)} (downloads)")
    found = shutil.which(interpreter)
    if found is None:
        raise VenvError(f"no {interpreter} on PATH to make {venv} with")
    shutil.rmtree(venv, ignore_errors=True)
    made = subprocess.run([found, "-m", "venv", str(venv)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        raise VenvError(f"{found} -m venv {venv} failed: {made.stderr.strip()[-500:]}")
    log = venv / "pip.log"
    pip = [str(python_of(peer)), "-m", "pip", "install", "--disable-pip-version-check"]
    for step in (["-r", str(requirements(peer))], ["--no-deps", "-e", str(ROOT)]):
        with open(log, "ab") as output:
            done = subprocess.run([*pip, *step], stdout=output, stderr=subprocess.STDOUT, timeout=1800, check=False)
        if done.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise VenvError(f"pip install {' '.join(step)} exited {done.returncode}; end of {log}:\n{tail}")
    installed.write_text(stamp(peer, interpreter))
    return python_of(peer)


def frozen(peer: str) -> list[str]:
    """Every package of the peer's venv with its version (kept with the results)."""
    freeze = [str(python_of(peer)), "-m", "pip", "freeze", "--disable-pip-version-check"]
    return subprocess.run(freeze, capture_output=True, text=True, check=False).stdout.split()
