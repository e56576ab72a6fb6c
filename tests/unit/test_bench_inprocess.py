"""The in-process study's parts that need no server: the wheel's library loaded through ctypes, its errors, the CPU
accounting of each path and the report's verdicts."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from bench.studies.facade import compare
from bench.studies.inprocess import METRICS, PATHS, cpu_now, report
from bench.studies.triton_capi import CApi, TritonError, missing_library, open_library
from tritonnx.backend.tensors import RAW_DTYPES
from tritonnx.server.triton import TritonInstall


@pytest.fixture(scope="module")
def api() -> CApi:
    install = TritonInstall.find()
    return CApi(open_library(next(install.library_dir.glob("libtritonserver*.so")), install.library_dir))


@pytest.mark.parametrize(
    ("message", "missing"),
    [
        (
            "libnghttp2-1cc16764.so.14.20.1: cannot open shared object file: No such file or directory",
            "libnghttp2-1cc16764.so.14.20.1",
        ),
        ("libz.so.1: cannot open shared object file: No such file or directory", "libz.so.1"),
        ("/opt/lib/libtritonserver.so: undefined symbol: curl_easy_init", None),
        ("/opt/lib/libtritonserver.so: cannot open shared object file: Permission denied", None),
    ],
)
def test_the_library_a_failed_dlopen_lacks_is_named_from_its_message(message, missing):
    assert missing_library(message) == missing


def test_the_wheels_library_loads_with_what_it_lacks_and_speaks_version_1_of_the_c_api(api):
    major, minor = ctypes.c_uint32(), ctypes.c_uint32()
    api.ApiVersion(ctypes.byref(major), ctypes.byref(minor))
    assert major.value == 1 and minor.value >= 3  # 1.3: the functions SIGNATURES declares


def test_every_datatype_name_of_the_project_is_one_the_library_knows(api):
    for name in RAW_DTYPES:
        code = api.StringToDataType(name.encode())
        assert code != 0, name  # 0: TRITONSERVER_TYPE_INVALID
        assert api.DataTypeString(code).decode() == name


def test_an_error_of_the_c_api_raises_with_its_code_and_message_and_null_is_success(api):
    assert api.check(None, None, ()) is None
    with pytest.raises(TritonError, match="bad input") as raised:
        api.check(api.ErrorNew(3, b"bad input"), None, ())  # 3: TRITONSERVER_ERROR_INVALID_ARG
    assert raised.value.code == "Invalid argument"


def test_a_servers_cpu_is_triton_core_and_its_childrens_the_stubs_in_either_layout():
    burn = "sum(range(3_000_000)); print('burnt', flush=True); input()"
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "burnt\n"
        apart = cpu_now(os.getpid(), child.pid)  # grpc: Triton a process of its own
        inside = cpu_now(os.getpid(), os.getpid())  # in-process: the child is a stub of this process
    finally:
        child.communicate("\n", timeout=60)
    assert apart["triton_ms"] > 0 and apart["stub_ms"] == 0
    assert apart["total_ms"] == pytest.approx(apart["caller_ms"] + apart["triton_ms"])
    assert inside["stub_ms"] >= apart["triton_ms"] > 0
    assert inside["triton_ms"] == pytest.approx(inside["caller_ms"] - inside["loop_ms"])
    assert inside["total_ms"] == pytest.approx(inside["caller_ms"] + inside["stub_ms"])


def test_the_report_judges_each_metric_in_process_against_grpc():
    def row(scale: float) -> dict:
        return {metric: scale * (index + 1) for index, metric in enumerate(METRICS)}

    rounds = [
        {"round": n, "order": list(PATHS)[:: 1 if n % 2 else -1], "grpc": row(1.0), "in-process": row(0.5 + n / 100)}
        for n in range(1, 6)
    ]
    pairs = {m: [(r["in-process"][m], r["grpc"][m]) for r in rounds] for m in METRICS}
    summary = {m: compare(pairs[m], higher) for m, (_, higher) in METRICS.items()}
    results = {"started": "now", "settings": {"seconds": 5.0}, "machine": "here", "rounds": rounds, "summary": summary}
    text = report(results, [])
    assert "| all CPU | 4.240 | 8.000 | 0.530 | [0.510, 0.550] | outside noise: in-process better |" in text
    assert "| c=16 req/s | 1.060 | 2.000 | 0.530 | [0.510, 0.550] | outside noise: in-process worse |" in text
    assert text.index("| grpc |") < text.index("| in-process |") < text.index("## Round 2")  # round 1's order
