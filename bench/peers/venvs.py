"""The peers' venvs under build/peers/<peer>/, made from their pinned requirements files.

Each peer's framework pulls its own numpy, protobuf, grpcio and web stack; they live apart from
the project's .venv and from each other. A venv is (re)built when its requirements file changes
(a stamp holds the file's hash), so `make bench-peers` downloads only the first time.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from bench.venvs import new_venv, pip_install

ROOT = Path(__file__).resolve().parents[2]
PEERS = Path(__file__).resolve().parent
BUILD = ROOT / "build" / "peers"
# The interpreter the venvs are made with (PEERS_PYTHON to change it); a peer may need its own.
DEFAULT_PYTHON = os.environ.get("PEERS_PYTHON", "python3.11")


def requirements(peer: str) -> Path:
    return PEERS / peer / "requirements.txt"


def python_of(peer: str) -> Path:
    return BUILD / peer / "bin" / "python"


def stamp(peer: str, interpreter: str) -> str:
    """What the venv was built from: the requirements file's hash and the interpreter."""
    return hashlib.sha256(requirements(peer).read_bytes() + interpreter.encode()).hexdigest()


def is_current(peer: str, interpreter: str = DEFAULT_PYTHON) -> bool:
    stamp_file = BUILD / peer / ".installed"
    return python_of(peer).exists() and stamp_file.exists() and stamp_file.read_text() == stamp(peer, interpreter)


def ensure(peer: str, interpreter: str = DEFAULT_PYTHON, say=print) -> Path:
    """The peer's venv Python, after building the venv if its requirements changed; pip's log in the venv."""
    if is_current(peer, interpreter):
        return python_of(peer)
    venv = BUILD / peer
    say(
        f"{peer}: making {venv} with {interpreter} from {requirements(peer).relative_to(ROOT)} (downloads on first use)"
    )
    new_venv(venv, interpreter)
    pip_install(venv, ["-r", str(requirements(peer))], venv / "pip.log")
    (venv / ".installed").write_text(stamp(peer, interpreter))
    return python_of(peer)


def frozen(peer: str) -> list[str]:
    """Every package of the peer's venv with its version (kept with the results)."""
    done = subprocess.run(
        [str(python_of(peer)), "-m", "pip", "freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.split()
