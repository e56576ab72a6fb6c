import pytest

from tests.serving import MODEL_REPOSITORY, MODELS
from tritonnx.server.repository import STOCK_MODEL_PY, add_model, link_models


def source_model(root, name="m", config='backend: "python"\n'):
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text("# model.py\n")
    (root / name / "1" / "model.onnx").write_bytes(b"onnx")
    return root / name


def test_linked_models_share_the_files_and_keep_or_replace_the_config(tmp_path):
    first, second = source_model(tmp_path / "src", "a"), source_model(tmp_path / "src", "b", "max_batch_size: 4\n")
    repository = link_models(tmp_path / "repo", {"a": first, "b": second}, {"a": "max_batch_size: 0\n"})
    assert (repository / "a" / "1" / "model.onnx").resolve() == (first / "1" / "model.onnx").resolve()
    assert (repository / "a" / "1" / "model.py").is_symlink()
    assert (repository / "a" / "config.pbtxt").read_text() == "max_batch_size: 0\n"
    assert (repository / "b" / "config.pbtxt").read_text() == "max_batch_size: 4\n"
    assert not (repository / "b" / "config.pbtxt").is_symlink()  # a copy: editing it leaves the source alone
    with pytest.raises(FileExistsError):
        link_models(repository, {"a": first})


def test_an_added_model_gets_its_config_and_the_stock_model_py(tmp_path):
    version = add_model(tmp_path / "repo", "new", 'backend: "python"\n')
    assert version == tmp_path / "repo" / "new" / "1"
    assert (version / "model.py").read_text() == STOCK_MODEL_PY.read_text()
    assert "OnnxRuntimeModel" in (version / "model.py").read_text()
    assert (version.parent / "config.pbtxt").read_text() == 'backend: "python"\n'


@pytest.mark.parametrize("model", MODELS)
def test_each_demo_model_runs_the_stock_model_py(model):
    assert (MODEL_REPOSITORY / model / "1" / "model.py").read_bytes() == STOCK_MODEL_PY.read_bytes()
