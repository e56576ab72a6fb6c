"""The profile study's attribution of sampled stacks (bench.studies.profile), on hand-written stacks."""

from __future__ import annotations

from collections import Counter

from bench.studies.profile import owner, profile_of


def test_a_frame_belongs_to_its_python_package_or_native_library_and_generic_frames_to_none():
    assert owner("InferenceServicer._serve (client/facade/service.py:180)") == "tritonnx"
    assert owner("Runner.run (backend/runner.py:90)") == "tritonnx"  # the checkout's backend/, as py-spy names it
    assert owner("Runner.run (/root/.pyenv/versions/3.11.7/lib/python3.11/asyncio/runners.py:118)") == "asyncio"
    assert owner("_call (/x/.venv/lib/python3.11/site-packages/grpc/aio/_call.py:3)") == "grpc"
    assert owner("0x7feda8ae79fa (grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so)") == "cygrpc"
    assert owner("MlasSgemmKernel (/x/onnxruntime/capi/libonnxruntime.so.1.32.0)") == "libonnxruntime"
    assert owner("sendmsg (libc.so.6)") is None
    assert owner("_PyEval_EvalFrameDefault (libpython3.11.so.1.0)") is None
    assert owner("Handle__run (loop.c:1234)") is None


def test_busy_samples_go_to_the_nearest_specific_frame_and_waiting_leaves_are_counted_apart():
    stacks = Counter(
        {
            ("main (app.py:1)", "run (tritonnx/a.py:2)", "memcpy (libc.so.6)"): 3,
            ("main (app.py:1)", "0x1 (grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so)", "sendmsg (libc.so.6)"): 2,
            ("poller (grpc/_server.py:9)", "epoll_wait (libc.so.6)"): 5,
            ("_start (libc.so.6)", "malloc (libc.so.6)"): 1,
        }
    )
    profile = profile_of(stacks)
    assert (profile["busy"], profile["waiting"]) == (6, 5)
    assert profile["owners"] == Counter({"tritonnx": 3, "cygrpc": 2, "interpreter/libc": 1})
    assert profile["functions"]["run (tritonnx/a.py)"] == 3
