"""Each module at one path, mapped into one namespace; imports go one way between tritonnx's subpackages, and
the stub side loads nothing of the others."""

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import tomllib

from tests.unit.conftest import _real_utils_path

CHECKOUT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"]
# Where each subpackage's files are: pyproject.toml's package-dir, else under tritonnx/.
FOLDERS = {
    name.split(".")[1]: CHECKOUT / SETUPTOOLS["package-dir"].get(name, name.replace(".", "/"))
    for name in SETUPTOOLS["packages"]
    if name.count(".") == 1
}
# What each subpackage may import of tritonnx besides itself: docs/layout.md draws it.
ALLOWED = {
    "backend": set(),
    "common": set(),
    "client": {"backend", "common"},
    "offline": {"backend"},
    "server": {"backend", "common", "client"},
    "commands": {"backend", "common", "client", "server", "offline"},
}


def imported_subpackages(source: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return {name.split(".")[1] for name in names if name.startswith("tritonnx.")}


def test_the_packaged_list_is_every_folder_of_the_namespace():
    listed = set(SETUPTOOLS["packages"])
    found = {"tritonnx"}
    for sub, folder in FOLDERS.items():
        found |= {
            ".".join(("tritonnx", sub, *init.parent.relative_to(folder).parts))
            for init in folder.rglob("__init__.py")
            if "__pycache__" not in init.parts
        }
    found |= {f"tritonnx.{path.name}" for path in (CHECKOUT / "tritonnx").iterdir() if (path / "__init__.py").is_file()}
    assert listed == found, "a new package needs its line in pyproject.toml's [tool.setuptools] packages"


def test_no_link_in_the_tree_and_each_module_imports_from_its_one_file():
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=CHECKOUT, capture_output=True, text=True, check=True)
    assert [line for line in tracked.stdout.splitlines() if line.startswith("120000")] == []
    for name in ("tritonnx.backend.runner", "tritonnx.client.facade.service", "tritonnx.server.stack"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        sub = name.split(".")[1]
        assert Path(spec.origin) == FOLDERS[sub].joinpath(*name.split(".")[2:]).with_suffix(".py")


def test_imports_between_subpackages_go_one_way():
    assert set(FOLDERS) == set(ALLOWED), "a new subpackage needs its place in ALLOWED and docs/layout.md"
    wrong = sorted(
        f"{source.relative_to(CHECKOUT)} imports tritonnx.{target}"
        for package, folder in FOLDERS.items()
        for source in folder.rglob("*.py")
        for target in imported_subpackages(source) - ALLOWED[package] - {package}
    )
    assert wrong == []


def test_the_stub_side_loads_nothing_of_the_other_processes_nor_their_dependencies():
    # A fresh interpreter, as the stub starts: Triton's real triton_python_backend_utils (pure
    # Python) on the path, then what a model.py and its instances import.
    code = (
        f"import json, sys; sys.path.insert(0, {str(_real_utils_path().parent)!r})\n"
        "import tritonnx.backend.triton_model, tritonnx.backend.runner\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert {"tritonnx.backend.triton_model", "tritonnx.backend.runner", "onnxruntime"} <= set(loaded)
    others = ("bench", "psutil", "tritonclient", "grpc")
    unwanted = [
        m for m in loaded if m.split(".")[0] in others or m.startswith("tritonnx.") and m.split(".")[1] != "backend"
    ]
    assert unwanted == []


def test_the_serving_processes_start_without_the_offline_tools_dependencies():
    """The slim images ship no onnx (publishing a version needs it; `tritonnx-models` runs beside them)."""
    code = (
        "import sys; sys.modules['onnx'] = None\n"  # an import of onnx now fails, as in the images
        "import tritonnx.commands.serve, tritonnx.client.facade.__main__, tritonnx.server.supervisor\n"
        "import tritonnx.server.stack\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
