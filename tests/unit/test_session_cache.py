"""The optimized-model cache: written once, read afterwards, never stale."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tritonnx.backend.session_cache import (
    COPIES_KEPT_PER_MODEL,
    KeyedSessionOptions,
    cache_key,
    create_session,
    default_cache_dir,
)
from tritonnx.backend.settings import SessionSettings

ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def options(level=ALL, **entries: str) -> KeyedSessionOptions:
    result = KeyedSessionOptions()
    result.graph_optimization_level = level
    for key, value in entries.items():
        result.add_session_config_entry(key.replace("__", "."), value)
    return result


def test_the_first_session_writes_the_copy_and_the_next_one_reads_it(double_onnx, ort_cache_dir):
    assert default_cache_dir() == ort_cache_dir
    logged = []
    first = create_session(double_onnx, options(), ort_cache_dir, logged.append)
    [copy] = ort_cache_dir.iterdir()
    assert cache_key(double_onnx, options()) in copy.name and first._model_path == str(double_onnx)
    second = create_session(double_onnx, options(), ort_cache_dir, logged.append)
    assert second._model_path == str(copy)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(second.run(None, {"x": x})[0], first.run(None, {"x": x})[0])
    assert logged == []


def test_a_changed_model_file_gets_a_new_copy(double_onnx, ort_cache_dir):
    create_session(double_onnx, options(), ort_cache_dir, print)
    before = cache_key(double_onnx, options())
    stat = double_onnx.stat()
    os.utime(double_onnx, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert cache_key(double_onnx, options()) != before
    session = create_session(double_onnx, options(), ort_cache_dir, print)
    assert session._model_path == str(double_onnx) and len(list(ort_cache_dir.iterdir())) == 2


def test_no_copy_without_optimizations_or_without_a_writable_directory(double_onnx, tmp_path):
    create_session(double_onnx, options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL), tmp_path / "a", print)
    assert not (tmp_path / "a").exists()
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    logged = []
    session = create_session(double_onnx, options(), blocked / "cache", logged.append)
    assert session.run(None, {"x": np.ones((1, 4), np.float32)})[0].tolist() == [[2.0] * 4]
    assert "no optimized-model cache" in logged[0]


def test_a_damaged_copy_is_rebuilt(double_onnx, ort_cache_dir):
    create_session(double_onnx, options(), ort_cache_dir, print)
    [copy] = ort_cache_dir.iterdir()
    copy.write_bytes(b"damaged")
    logged = []
    session = create_session(double_onnx, options(), ort_cache_dir, logged.append)
    assert "unusable" in logged[0] and session._model_path == str(double_onnx)
    assert copy.stat().st_size > len(b"damaged")


def test_only_the_most_recently_used_copies_of_a_model_are_kept(double_onnx, ort_cache_dir):
    stat = double_onnx.stat()
    for step in range(4):  # four versions of the file, each optimized once
        os.utime(double_onnx, ns=(stat.st_atime_ns, stat.st_mtime_ns + step * 1_000_000))
        create_session(double_onnx, options(), ort_cache_dir, print)
    kept = list(ort_cache_dir.iterdir())
    assert len(kept) == COPIES_KEPT_PER_MODEL
    assert any(cache_key(double_onnx, options()) in p.name for p in kept)  # the newest survives


def test_a_cache_that_cannot_be_written_means_no_cache_not_a_failed_model(double_onnx, tmp_path):
    # A cache directory a user cannot write (a root-owned volume in a container run as uid 1000) must
    # not fail the model. /proc/self is a directory nobody can create files in, root included.
    lines = []
    session = create_session(double_onnx, options(), Path("/proc/self"), lines.append)
    assert session.run(None, {"x": np.ones((1, 4), np.float32)})[0].tolist() == [[2.0] * 4]
    assert any("serving without it" in line or "no optimized-model cache" in line for line in lines), lines
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    lines.clear()
    assert create_session(double_onnx, options(), not_a_dir, lines.append) is not None
    assert any("no optimized-model cache" in line for line in lines)


def test_a_session_with_another_provider_first_neither_reads_nor_writes_the_copy(
    double_onnx, ort_cache_dir, monkeypatch
):
    import tritonnx.backend.session_cache

    create_session(double_onnx, options(), ort_cache_dir, print)  # the CPU provider's copy, made
    [copy] = ort_cache_dir.iterdir()
    before = copy.stat().st_mtime_ns
    built = []
    real = ort.InferenceSession

    def recording(path, session_options, providers):
        built.append((path, providers, session_options.optimized_model_filepath))
        return real(path, session_options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(tritonnx.backend.session_cache.ort, "InferenceSession", recording)
    accelerated = [("OpenVINOExecutionProvider", {"device_type": "CPU"}), "CPUExecutionProvider"]
    create_session(double_onnx, options(), ort_cache_dir, print, accelerated)
    assert built == [(str(double_onnx), accelerated, "")]  # from the model file, nothing saved
    assert list(ort_cache_dir.iterdir()) == [copy] and copy.stat().st_mtime_ns == before


def test_every_setting_that_can_change_the_optimized_graph_gets_its_own_copy(double_onnx, ort_cache_dir):
    base = cache_key(double_onnx, options())
    assert cache_key(double_onnx, options()) == base
    changed = {
        "level": cache_key(double_onnx, options(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)),
        "a session entry": cache_key(double_onnx, options(session__disable_prepacking="1")),
        "its value": cache_key(double_onnx, options(session__disable_prepacking="0")),
        "another entry": cache_key(double_onnx, options(session__intra_op__allow_spinning="0")),
    }
    assert len({base, *changed.values()}) == 1 + len(changed), changed
    with_library = options()
    with_library.custom_op_libraries.append("libcustom.so")  # as registering it records it
    assert cache_key(double_onnx, with_library) != base

    # A `session.*` parameter of config.pbtxt reaches the key through the instance's settings.
    def configured(value: str) -> KeyedSessionOptions:
        parameters = {"session.disable_prepacking": {"string_value": value}}
        return SessionSettings.from_model_config({"parameters": parameters}, cores=2).session_options()

    assert cache_key(double_onnx, configured("1")) != cache_key(double_onnx, configured("0"))
    # Settings that leave the graph as it is share the copy.
    threads = options()
    threads.intra_op_num_threads, threads.execution_mode = 3, ort.ExecutionMode.ORT_PARALLEL
    assert cache_key(double_onnx, threads) == base

    create_session(double_onnx, options(), ort_cache_dir, print)
    session = create_session(double_onnx, options(session__disable_prepacking="1"), ort_cache_dir, print)
    assert session._model_path == str(double_onnx) and len(list(ort_cache_dir.iterdir())) == 2  # not the stale copy


def test_options_whose_entries_the_key_cannot_see_build_from_the_model_file(double_onnx, ort_cache_dir):
    plain = ort.SessionOptions()
    plain.add_session_config_entry("session.disable_prepacking", "1")
    session = create_session(double_onnx, plain, ort_cache_dir, print)
    assert session._model_path == str(double_onnx) and not ort_cache_dir.exists()
