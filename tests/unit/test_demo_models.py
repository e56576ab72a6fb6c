"""The generated demo models: valid ONNX, the promised signatures, sane and batch-safe outputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tritonnx.offline.demo_models import MODELS, count_parameters, generate, model_path
from tritonnx.offline.demo_models.__main__ import main

IMAGE_MODELS = ["resnet50", "mobilenet_v3_small"]
CHEAP_MODELS = ["mobilenet_v3_small", "text_classifier", "token_classifier"]  # rebuilt in-test; resnet50 takes ~3 s
ROOT = Path(__file__).resolve().parents[2]


def _session(
    model: Path | bytes,
    level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    source = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 224, 224), dtype=np.float32)


def _token_batch(lengths: list[int], width: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded `input_ids`/`attention_mask` with random tokens (ids 1..999)."""
    rng = np.random.default_rng(1)
    ids = np.full((len(lengths), width), pad_id, np.int64)
    mask = np.zeros((len(lengths), width), np.int64)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(1, 1000, length)
        mask[row, :length] = 1
    return ids, mask


def _run_text(session: ort.InferenceSession, ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    return session.run(["logits", "embedding"], {"input_ids": ids, "attention_mask": mask})


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("model_repository")
    paths = generate(repo, log=lambda _: None)
    assert paths == [model_path(repo, name) for name in MODELS]
    return repo


@pytest.fixture(scope="module")
def sessions(repository: Path) -> dict[str, ort.InferenceSession]:
    return {name: _session(model_path(repository, name)) for name in MODELS}


@pytest.mark.parametrize("name", list(MODELS))
def test_model_passes_checker(repository: Path, name: str) -> None:
    model = onnx.load(str(model_path(repository, name)))
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert model.ir_version <= 10


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_image_model_signature(sessions: dict[str, ort.InferenceSession], name: str) -> None:
    session = sessions[name]
    [inp] = session.get_inputs()
    [out] = session.get_outputs()
    assert (inp.name, inp.type, inp.shape) == ("input", "tensor(float)", ["batch", 3, 224, 224])
    assert (out.name, out.type, out.shape) == ("output", "tensor(float)", ["batch", 1000])


def test_text_classifier_signature(sessions: dict[str, ort.InferenceSession]) -> None:
    session = sessions["text_classifier"]
    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == [
        ("input_ids", "tensor(int64)", ["batch", "sequence"]),
        ("attention_mask", "tensor(int64)", ["batch", "sequence"]),
    ]
    assert [(o.name, o.type, o.shape) for o in session.get_outputs()] == [
        ("logits", "tensor(float)", ["batch", 2]),
        ("embedding", "tensor(float)", ["batch", 64]),
    ]


def test_token_classifier_signature(sessions: dict[str, ort.InferenceSession]) -> None:
    session = sessions["token_classifier"]
    assert [(i.name, i.shape) for i in session.get_inputs()] == [
        ("input_ids", ["batch", "sequence"]),
        ("attention_mask", ["batch", "sequence"]),
    ]
    assert [(o.name, o.type, o.shape) for o in session.get_outputs()] == [
        ("token_logits", "tensor(float)", ["batch", "sequence", 5]),
    ]


def test_token_classifier_tags_each_token_as_it_would_alone(sessions: dict[str, ort.InferenceSession]) -> None:
    session = sessions["token_classifier"]
    lengths = [3, 11, 7]
    ids, mask = _token_batch(lengths, 11)
    [padded] = session.run(None, {"input_ids": ids, "attention_mask": mask})
    assert padded.shape == (3, 11, 5) and np.isfinite(padded).all()
    for row, length in enumerate(lengths):
        [alone] = session.run(
            None, {"input_ids": ids[row : row + 1, :length], "attention_mask": mask[row : row + 1, :length]}
        )
        assert alone.shape == (1, length, 5)
        np.testing.assert_allclose(padded[row, :length], alone[0], atol=1e-5, rtol=0)
    assert np.abs(padded[0, 0] - padded[0, 1]).max() > 1e-3  # tokens get their own logits


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [("resnet50", 25.0e6, 26.0e6), ("mobilenet_v3_small", 2.4e6, 2.6e6)],
)
def test_parameter_count(repository: Path, name: str, low: float, high: float) -> None:
    # count_parameters excludes BN running mean/var, like torch's module.parameters().
    count = count_parameters(onnx.load(str(model_path(repository, name))))
    assert low <= count <= high


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_image_model_batch_rows_match_single_runs(sessions: dict[str, ort.InferenceSession], name: str) -> None:
    session = sessions[name]
    images = _images(3)
    [batched] = session.run(None, {"input": images})
    assert batched.shape == (3, 1000) and batched.dtype == np.float32
    assert np.isfinite(batched).all()
    assert 0.01 < batched.std() < 100  # neither collapsed nor blown up
    # Rows must differ, or matching single runs would prove nothing about batching.
    assert np.abs(batched[0] - batched[1]).max() > 1e-3
    for row in range(3):
        [single] = session.run(None, {"input": images[row : row + 1]})
        assert single.shape == (1, 1000)
        np.testing.assert_allclose(single[0], batched[row], atol=1e-4, rtol=0)


def test_text_classifier_runs(sessions: dict[str, ort.InferenceSession]) -> None:
    session = sessions["text_classifier"]
    for batch in (1, 3):
        logits, embedding = _run_text(session, *_token_batch([7] * batch, 7))
        assert logits.shape == (batch, 2) and embedding.shape == (batch, 64)
        assert np.isfinite(logits).all() and np.isfinite(embedding).all()
        assert 0.01 < embedding.std() < 100


# ORT's fusions rewrite the attention, GELU and position lookup, so check both graphs.
@pytest.mark.parametrize(
    "level",
    [ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL],
    ids=["optimized", "unoptimized"],
)
def test_text_classifier_ignores_padding(repository: Path, level: ort.GraphOptimizationLevel) -> None:
    session = _session(model_path(repository, "text_classifier"), level)
    lengths = [5, 9, 16]
    ids, mask = _token_batch(lengths, 16)
    logits, embedding = _run_text(session, ids, mask)
    for row, length in enumerate(lengths):
        alone_logits, alone_embedding = _run_text(session, ids[row : row + 1, :length], mask[row : row + 1, :length])
        np.testing.assert_allclose(logits[row], alone_logits[0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(embedding[row], alone_embedding[0], atol=1e-5, rtol=0)
    # Whatever sits under mask == 0 is ignored, not just token 0.
    noisy_ids = np.where(mask == 1, ids, 999)
    noisy_logits, noisy_embedding = _run_text(session, noisy_ids, mask)
    np.testing.assert_allclose(noisy_logits, logits, atol=1e-5, rtol=0)
    np.testing.assert_allclose(noisy_embedding, embedding, atol=1e-5, rtol=0)


def test_text_classifier_fully_padded_row_is_finite(
    sessions: dict[str, ort.InferenceSession],
) -> None:
    ids, mask = _token_batch([0, 4], 4)
    logits, embedding = _run_text(sessions["text_classifier"], ids, mask)
    assert np.isfinite(logits).all()
    np.testing.assert_array_equal(embedding[0], 0.0)  # mean over no positions is defined as 0


@pytest.mark.parametrize("name", CHEAP_MODELS)
def test_same_seed_same_bytes(repository: Path, name: str) -> None:
    assert MODELS[name](0).SerializeToString() == model_path(repository, name).read_bytes()


@pytest.mark.parametrize("name", CHEAP_MODELS)
def test_other_seed_other_outputs(sessions: dict[str, ort.InferenceSession], name: str) -> None:
    other = _session(MODELS[name](1).SerializeToString())
    if name in ("text_classifier", "token_classifier"):
        feeds = dict(zip(["input_ids", "attention_mask"], _token_batch([6], 6), strict=False))
    else:
        feeds = {"input": _images(1)}
    ours = sessions[name].run(None, feeds)[0]
    theirs = other.run(None, feeds)[0]
    assert np.abs(ours - theirs).max() > 1e-3


def test_generate_rejects_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown demo model"):
        generate(tmp_path, ["resnet51"], log=lambda _: None)


def test_cli_skips_existing_model_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = model_path(tmp_path, "text_classifier")
    argv = ["--repository", str(tmp_path), "text_classifier"]

    assert main(argv) == 0
    assert "building text_classifier ..." in capsys.readouterr().out
    first = path.stat()

    assert main(argv) == 0
    assert "text_classifier: cached" in capsys.readouterr().out
    second = path.stat()
    assert (second.st_ino, second.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)

    assert main([*argv, "--force", "--seed", "3"]) == 0
    assert "building text_classifier ..." in capsys.readouterr().out
    # A new inode: the file was replaced, not rewritten in place.
    assert path.stat().st_ino != first.st_ino
    assert path.read_bytes() == MODELS["text_classifier"](3).SerializeToString()
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx"]  # no temp left


def test_cli_rejects_unknown_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--repository", str(tmp_path), "resnet51"])
    assert exit_info.value.code == 2
    assert "unknown model(s): resnet51" in capsys.readouterr().err


def test_cli_runs_as_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tritonnx.offline.demo_models", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--repository" in result.stdout and "mobilenet_v3_small" in result.stdout
