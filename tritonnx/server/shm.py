"""Whether /dev/shm can hold what a model repository needs, checked before tritonserver starts.

Every instance of a Python-backend model is a stub process with a shared-memory region in
/dev/shm (`STUB_REGION_BYTES` to start with), and each model loading briefly has one more stub
for auto-complete. Docker gives a container 64 MB of /dev/shm; a /dev/shm that fills up makes
stubs fail to start or die of SIGBUS later, far from the cause. So the serving command refuses to
start and says what to give instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tritonnx.server.process import ServerError

STUB_REGION_BYTES = 16 * 1024 * 1024  # tritonserver's --backend-config=python,shm-default-byte-size
LOADS_AT_ONCE = 4  # tritonserver loads up to 4 models in parallel, each with an auto-complete stub
_COUNT = re.compile(r"\bcount\s*:\s*(\d+)")
# An ensemble runs in tritonserver itself: no stub, no region, not even to load.
_ENSEMBLE = re.compile(r'^\s*platform\s*:\s*"ensemble"', re.MULTILINE)
# Triton's default instance count for a model with no instance_group: 2 for the backend named onnxruntime (a
# platform of onnxruntime_onnx, or no config and a model.onnx), 1 for any other.
_ONNXRUNTIME = re.compile(r'^\s*(platform\s*:\s*"onnxruntime_onnx"|backend\s*:\s*"onnxruntime")', re.MULTILINE)
_MIB = 1024 * 1024


def stub_instances(repository: Path, names: tuple[str, ...] = ("*",)) -> tuple[int, int]:
    """(models, Python stub instances) of the models `names` ("*": all) of a model repository.

    The instances come from each config.pbtxt's instance_group; ensembles have none and are not counted.
    """
    models = instances = 0
    for model in sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if "*" not in names and model.name not in names:
            continue
        try:
            text = (model / "config.pbtxt").read_text()
        except OSError:
            text = ""  # no config.pbtxt: Triton infers one from the files
        text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        if _ENSEMBLE.search(text):
            continue
        models += 1
        group = text[text.index("instance_group") :] if "instance_group" in text else ""
        onnxruntime = _ONNXRUNTIME.search(text) or (not text.strip() and any(model.glob("*/model.onnx")))
        instances += sum(int(n) for n in _COUNT.findall(group.split("]", 1)[0])) or (2 if onnxruntime else 1)
    return models, instances


def needed_bytes(repository: Path, names: tuple[str, ...] = ("*",)) -> int:
    models, instances = stub_instances(repository, names)
    return (instances + min(models, LOADS_AT_ONCE)) * STUB_REGION_BYTES


def check_shared_memory(repository: Path, names: tuple[str, ...] = ("*",), shm: Path = Path("/dev/shm")) -> None:
    """Raise ServerError with what to do when `shm` has less room than the models `names` of `repository` need."""
    needed = needed_bytes(repository, names)
    stats = os.statvfs(shm)
    free = stats.f_bavail * stats.f_frsize
    if free < needed:
        models, instances = stub_instances(repository, names)
        raise ServerError(
            f"{shm} has {free // _MIB} MiB free, and the {models} model(s) of {repository} need about "
            f"{needed // _MIB} MiB ({instances} Python stub instance(s) and up to {min(models, LOADS_AT_ONCE)} "
            f"loading at once, {STUB_REGION_BYTES // _MIB} MiB each): give it more, e.g. `docker run "
            f"--shm-size=512m`, or an emptyDir with medium: Memory at /dev/shm in Kubernetes"
        )
