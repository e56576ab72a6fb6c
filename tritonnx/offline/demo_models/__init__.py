"""The project's demo ONNX models, generated locally with seeded random weights.

Nothing is downloaded: each builder writes the architecture op by op with `onnx.helper` and
fills it from `numpy.random.default_rng(seed)`, so a seed always gives the same model. The
weights are random, so outputs are meaningless but finite, deterministic and shaped as a trained
model's would be, which is all serving, batching and load tests need.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import onnx

from tritonnx.offline.demo_models.graph import count_parameters
from tritonnx.offline.demo_models.mobilenet import build_mobilenet_v3_small
from tritonnx.offline.demo_models.resnet import build_resnet50
from tritonnx.offline.demo_models.text_classifier import build_text_classifier, build_token_classifier

Builder = Callable[[int], onnx.ModelProto]

# Model name (also its directory in the model repository) -> builder taking the seed.
MODELS: dict[str, Builder] = {
    "resnet50": build_resnet50,
    "mobilenet_v3_small": build_mobilenet_v3_small,
    "text_classifier": build_text_classifier,
    "token_classifier": build_token_classifier,
}
DEFAULT_SEED = 0


def model_path(repository: Path, name: str) -> Path:
    """Where Triton expects version 1 of `name`: `<repository>/<name>/1/model.onnx`."""
    return Path(repository) / name / "1" / "model.onnx"


def generate(
    repository: Path,
    names: Sequence[str] | None = None,
    force: bool = False,
    *,
    seed: int = DEFAULT_SEED,
    log: Callable[[str], None] = print,
) -> list[Path]:
    """Write the named models (all when `names` is None) into `repository`.

    A model whose file already exists is left alone ("cached") unless `force`. Returns the
    model file of every requested model, built or cached, in request order.
    """
    names = list(MODELS) if names is None else list(names)
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        raise ValueError(f"unknown demo model(s) {unknown}; available: {sorted(MODELS)}")
    paths = []
    for name in names:
        path = model_path(repository, name)
        if path.exists() and not force:
            log(f"{name}: cached ({path} exists; force to rebuild)")
        else:
            log(f"building {name} ...")
            start = time.perf_counter()
            model = MODELS[name](seed)
            size = _write_atomic(model.SerializeToString(), path)
            log(
                f"  {count_parameters(model) / 1e6:.2f}M params, {size / 1e6:.1f} MB, "
                f"{time.perf_counter() - start:.1f} s -> {path}"
            )
        paths.append(path)
    return paths


def _write_atomic(data: bytes, path: Path) -> int:
    """Write `data` to `path` atomically and return its size.

    The temp file sits in the same directory so os.replace is a rename within one filesystem:
    readers (Triton loading the repository, a concurrent generator) never see a partial model.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only still there if writing or replacing failed
    return len(data)


__all__ = ["DEFAULT_SEED", "MODELS", "count_parameters", "generate", "model_path"]
