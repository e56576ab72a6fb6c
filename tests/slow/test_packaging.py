"""The wheel of a clean clone works: built from `git clone` (no generated file of this checkout), installed with
its own dependency ranges into a fresh venv, every module imports, every console script answers --help, and
the docs' Python imports run.

Triton's `triton_python_backend_utils` is the one module the package does not install: the Python stub
provides it, so it is put on the path as the stub would.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

from tests.docs_blocks import all_blocks
from tests.serving import CHECKOUT
from tests.unit.conftest import _real_utils_path

SCRIPTS = ("tritonnx-serve", "tritonnx-facade", "tritonnx-models")
IMPORT_ALL = """
import importlib, json, pkgutil, sys
import tritonnx
names = [m.name for m in pkgutil.walk_packages(tritonnx.__path__, "tritonnx.")]
failed = {}
for name in names:
    if name.endswith("__main__"):
        continue
    try:
        importlib.import_module(name)
    except Exception as error:
        failed[name] = f"{type(error).__name__}: {error}"
print(json.dumps({"modules": names, "failed": failed, "from": [tritonnx.__file__]}))
"""
IMPORT_LINE = re.compile(r"^(import \w|from \w[\w.]* import )")


def run(command: list, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (command, done.stdout[-3000:], done.stderr[-3000:])
    return done


def docs_imports() -> list[str]:
    """Every import line of the Python blocks of README.md and docs/ (what a user pastes first)."""
    lines = {
        line.split("#")[0].strip()
        for block in all_blocks()
        if block.kind == "python"
        for line in block.text.splitlines()
        if IMPORT_LINE.match(line)
    }
    return sorted(lines)


def test_a_clean_clones_wheel_installs_and_every_module_script_and_docs_import_works(tmp_path):
    source = tmp_path / "clone"
    run(["git", "clone", "-q", "--no-local", str(CHECKOUT), str(source)], tmp_path)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(source)], tmp_path)
    (wheel,) = (tmp_path / "dist").glob("tritonnx-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        files = archive.namelist()
    assert "tritonnx/client/proto/inference.proto" in files and "tritonnx/client/proto/inference_pb2.py" in files
    assert not any(name.startswith(("backend/", "client/")) for name in files), "one namespace: tritonnx"

    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)], tmp_path)
    (site_packages,) = (tmp_path / "venv" / "lib").glob("python*/site-packages")
    (dist_info,) = site_packages.glob("tritonnx-*.dist-info")
    installed = {line.split(",")[0].split("/")[0] for line in (dist_info / "RECORD").read_text().splitlines()}
    assert installed == {"tritonnx", dist_info.name, ".."}, installed  # "..": the console scripts in bin/

    code = f"import sys; sys.path.append({str(_real_utils_path().parent)!r})\n" + IMPORT_ALL
    report = json.loads(run([python, "-c", code], tmp_path, timeout=300).stdout)
    assert all(str(tmp_path / "venv") in where for where in report["from"]), report["from"]  # not the checkout
    assert len(report["modules"]) > 50 and "tritonnx.client.facade.service" in report["modules"]
    assert report["failed"] == {}

    for script in SCRIPTS:
        helped = run([tmp_path / "venv" / "bin" / script, "--help"], tmp_path, timeout=60)
        assert "usage:" in helped.stdout, script
    imports = docs_imports()
    assert "from tritonnx.client.proto import inference_pb2, inference_pb2_grpc" in imports
    run([python, "-c", "\n".join(imports)], tmp_path, timeout=120)
