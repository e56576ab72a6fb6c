"""The package declares what it imports: installed from pyproject.toml alone into a fresh venv, every module loads.

pip resolves the package's own dependency ranges (no requirements file, no --no-deps) and installs one top-level
package, `tritonnx`; then each of its modules is imported by the fresh interpreter from outside the checkout, and the console scripts
answer --help. Triton's `triton_python_backend_utils` is the one module the package does not install: the Python
stub provides it, so it is put on the path as the stub would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import venv

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


def test_installed_from_its_own_requirements_every_module_imports(tmp_path):
    # The package's files as a source tree of their own: pip builds in the tree it is given.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(CHECKOUT / name, source / name)
    for package in ("tritonnx", "backend", "client"):  # tritonnx/backend and tritonnx/client stay links
        shutil.copytree(
            CHECKOUT / package, source / package, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    (site_packages,) = (tmp_path / "venv" / "lib").glob("python*/site-packages")
    (dist_info,) = site_packages.glob("tritonnx-*.dist-info")
    assert (dist_info / "top_level.txt").read_text().split() == ["tritonnx"]
    installed = {line.split(",")[0].split("/")[0] for line in (dist_info / "RECORD").read_text().splitlines()}
    assert installed == {"tritonnx", dist_info.name, ".."}, installed  # "..": the console scripts in bin/

    code = f"import sys; sys.path.append({str(_real_utils_path().parent)!r})\n" + IMPORT_ALL
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert all(str(tmp_path / "venv") in where for where in report["from"]), report["from"]  # not the checkout
    assert len(report["modules"]) > 50 and "tritonnx.client.facade.service" in report["modules"]
    assert report["failed"] == {}

    for script in SCRIPTS:
        helped = subprocess.run(
            [tmp_path / "venv" / "bin" / script, "--help"], capture_output=True, text=True, timeout=60, check=False
        )
        assert helped.returncode == 0 and "usage:" in helped.stdout, (script, helped.stderr[-2000:])
