"""Model repositories: scratch ones, and a model's `config.pbtxt` as Triton reads it.

A benchmark, the tuner, the tests and the conformance run each serve a repository of their own:
models linked from the demo repository (each version's files symlinked, `config.pbtxt` copied or
replaced) or new ones with the stock `model.py` and a policy-only `config.pbtxt`.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

import tritonnx.backend
from tritonnx.backend.model_files import CONFIG_FILE


def read_config(model_dir: Path) -> dict:
    """The model's config.pbtxt as Triton's ModelConfig in JSON form (what model control takes as `config`).

    Raises OSError when it cannot be read, ValueError (text_format.ParseError) when it is not a ModelConfig.
    """
    text = (model_dir / CONFIG_FILE).read_text()
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    return json_format.MessageToDict(config, preserving_proto_field_name=True)


# Every version's model.py, shipped in the package so any repository can get it.
STOCK_MODEL_PY = Path(tritonnx.backend.__file__).with_name("stock_model.py")


def link_models(directory: Path, models: Mapping[str, Path], configs: Mapping[str, str] | None = None) -> Path:
    """`directory` serving `models` (name -> a model's folder in another repository).

    Every version's files and the model's other files (an ensemble's labels) symlinked, config.pbtxt copied unless
    `configs` gives its text. Returns `directory`.
    """
    for name, source in models.items():
        target = directory / name
        target.mkdir(parents=True)
        for version in (v for v in source.iterdir() if v.is_dir() and v.name.isdigit()):
            (target / version.name).mkdir()
            for item in version.iterdir():
                (target / version.name / item.name).symlink_to(item.resolve())
        for item in (i for i in source.iterdir() if i.is_file() and i.name != CONFIG_FILE):
            (target / item.name).symlink_to(item.resolve())
        config = (configs or {}).get(name)
        if config is None:
            shutil.copyfile(source / "config.pbtxt", target / "config.pbtxt")
        else:
            (target / "config.pbtxt").write_text(config)
    return directory


def add_model(directory: Path, name: str, config: str, model_py: Path | None = None) -> Path:
    """`directory/name` with `config` as config.pbtxt and `model_py` in version 1; the version folder.

    `model_py` defaults to the stock one. The caller puts `model.onnx` in the folder returned (and any
    external data beside it).
    """
    version = directory / name / "1"
    version.mkdir(parents=True)
    (directory / name / "config.pbtxt").write_text(config)
    shutil.copyfile(model_py or STOCK_MODEL_PY, version / "model.py")
    return version
