import os

import pytest

from tests.serving import IMAGE_CLASSIFIERS, MODEL_REPOSITORY, MODELS
from tritonnx.server.process import ServerError
from tritonnx.server.shm import STUB_REGION_BYTES, check_shared_memory, needed_bytes, stub_instances


def repository(tmp_path):
    configs = {
        "two": 'backend: "python"\n# instance_group [ { count: 9 } ] (a comment)\ninstance_group [ { kind: KIND_CPU, count: 2 } ]\n',
        "split": 'instance_group [ { count: 1 }, { count: 3 } ]\nparameters { key: "count: 7" }\n',
        "default": 'backend: "python"\n',
        "onnxruntime": 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n',  # Triton's default for it: 2
    }
    for name, text in configs.items():
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(text)
    (tmp_path / "bare" / "1").mkdir(parents=True)  # no config.pbtxt: Triton infers one instance
    (tmp_path / "bare_onnx" / "1").mkdir(parents=True)
    (tmp_path / "bare_onnx" / "1" / "model.onnx").write_bytes(b"graph")  # no config.pbtxt: onnxruntime, 2
    return tmp_path


def test_instances_come_from_each_instance_group(tmp_path):
    repo = repository(tmp_path)
    assert stub_instances(repo) == (6, 2 + 4 + 1 + 1 + 2 + 2)
    assert needed_bytes(repo) == (12 + 4) * STUB_REGION_BYTES


def test_a_dev_shm_too_small_refuses_to_start_with_what_to_give(tmp_path, monkeypatch):
    repo = repository(tmp_path)

    class Small:
        f_bavail, f_frsize = 64 * 1024 * 1024 // 4096, 4096  # Docker's default 64 MB

    monkeypatch.setattr(os, "statvfs", lambda path: Small)
    with pytest.raises(ServerError) as refused:
        check_shared_memory(repo)
    message = str(refused.value)
    assert "/dev/shm has 64 MiB free" in message and "need about 256 MiB" in message
    assert "--shm-size=512m" in message and "emptyDir with medium: Memory" in message


def test_the_demo_repository_fits_this_machine():
    from tests.serving import MODEL_REPOSITORY

    check_shared_memory(MODEL_REPOSITORY)  # raises when it does not


def test_an_ensemble_has_no_stub_and_is_not_counted(tmp_path):
    repo = repository(tmp_path)
    (repo / "pipeline" / "1").mkdir(parents=True)
    (repo / "pipeline" / "config.pbtxt").write_text(
        '# runs in tritonserver\nplatform: "ensemble"\nmax_batch_size: 16\n'
    )
    assert stub_instances(repo) == (6, 2 + 4 + 1 + 1 + 2 + 2)
    # The demo repository: its two image ensembles add nothing, image_preprocess its instances.
    assert stub_instances(MODEL_REPOSITORY) == stub_instances(MODEL_REPOSITORY, (*MODELS, "image_preprocess"))
    assert stub_instances(MODEL_REPOSITORY, tuple(f"{m}_image" for m in IMAGE_CLASSIFIERS)) == (0, 0)
