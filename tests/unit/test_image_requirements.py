"""Each version is written once, and the images install exactly what the venv runs.

deploy/docker/requirements-image.txt (and -models.txt) pin every package the images install; requirements.txt
and requirements-serving.txt name those packages without a version and take the images' with -c.
"""

import importlib.metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENT_FILES = [
    "requirements.txt",
    "requirements-serving.txt",
    "requirements-dev.txt",
    "requirements-triton.txt",
    "bench/requirements-bench.txt",
    "deploy/docker/requirements-image.txt",
    "deploy/docker/requirements-models.txt",
]


def _name(name: str) -> str:
    return name.lower().replace("_", "-")


def _named(path: Path) -> list[Requirement]:
    """Every requirement line of the file (comments, -r and -c lines left out), markers kept."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def _taken(requirement: Requirement, python: str | None) -> bool:
    """Whether `python` (default: this one) installs it: no marker, or one that holds there."""
    return requirement.marker is None or requirement.marker.evaluate({"python_version": python} if python else None)


def requirements(path: Path, python: str | None = None) -> dict[str, str | None]:
    """The packages the file names for `python` (default: this one), with the version it pins (None: none)."""
    found: dict[str, str | None] = {}
    for requirement in _named(path):
        if _taken(requirement, python):
            exact = [spec.version for spec in requirement.specifier if spec.operator == "=="]
            found[_name(requirement.name)] = exact[0] if exact else None
    return found


def pins(path: Path) -> dict[str, str]:
    """The versions the file pins itself."""
    return {name: version for name, version in requirements(path).items() if version is not None}


def included(path: Path, option: str) -> list[Path]:
    """The files it names with `-r` or `-c`, relative to it as pip reads them."""
    return [
        (path.parent / line.split(None, 1)[1]).resolve()
        for line in path.read_text().splitlines()
        if line.startswith(f"{option} ")
    ]


def constraints(path: Path) -> dict[str, str]:
    """Every version pip takes for the file: its own pins, those of the files it constrains by, and its -r files'."""
    versions = pins(path)
    for constraint in included(path, "-c"):
        versions |= pins(constraint)
    for nested in included(path, "-r"):
        versions |= constraints(nested)
    return versions


def test_each_version_is_written_once():
    pinned_in: dict[str, list[str]] = {}
    for file in REQUIREMENT_FILES:
        for name in pins(ROOT / file):
            pinned_in.setdefault(name, []).append(file)
    assert {name: files for name, files in pinned_in.items() if len(files) > 1} == {}


def test_every_package_named_has_its_version_from_the_file_or_its_constraints():
    for file in REQUIREMENT_FILES:
        versions = constraints(ROOT / file)
        assert [name for name in requirements(ROOT / file) if name not in versions] == [], file


def test_the_venv_and_the_images_take_the_same_versions():
    # requirements.txt names the packages the images pin: its constraints are the image files.
    image = pins(ROOT / "deploy/docker/requirements-image.txt") | pins(ROOT / "deploy/docker/requirements-models.txt")
    runtime = requirements(ROOT / "requirements.txt") | requirements(ROOT / "requirements-serving.txt")
    shared = set(image) & set(runtime)
    assert {
        "numpy",
        "onnxruntime",
        "pillow",
        "tritonclient",
        "grpcio",
        "protobuf",
        "aiohttp",
        "psutil",
        "onnx",
    } <= shared
    assert {name: constraints(ROOT / "requirements.txt")[name] for name in shared} == {
        name: image[name] for name in shared
    }


def test_the_image_pins_are_the_venvs_versions():
    image = pins(ROOT / "deploy/docker/requirements-image.txt") | pins(ROOT / "deploy/docker/requirements-models.txt")
    installed = {name: importlib.metadata.version(name) for name in image}
    assert installed == image


def test_the_packages_ranges_admit_the_pinned_versions():
    """pyproject.toml's ranges (what `pip install tritonnx` resolves) hold the versions the venv and images run."""
    versions = constraints(ROOT / "requirements.txt")
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    outside = {}
    for dependency in map(Requirement, dependencies):
        version = versions[_name(dependency.name)]
        if not dependency.specifier.contains(version, prereleases=True):
            outside[dependency.name] = (str(dependency.specifier), version)
    assert outside == {}


def test_each_image_python_gets_one_version_of_each_package():
    """The NGC image's Python 3.10 and the others' 3.11 each take exactly one pin of every package the images name."""
    for file in ("deploy/docker/requirements-image.txt", "deploy/docker/requirements-models.txt"):
        named = _named(ROOT / file)
        for python in ("3.10", "3.11"):
            taken = sorted(_name(r.name) for r in named if _taken(r, python))
            assert taken == sorted({_name(r.name) for r in named}), (file, python)
    assert requirements(ROOT / "deploy/docker/requirements-image.txt", "3.10")["onnxruntime"] == "1.23.2"
