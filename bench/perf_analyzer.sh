#!/bin/sh
# .venv/bin/perf_analyzer (installed by `make venv`): tritonclient's perf_analyzer links
# libcudart.so.12 even without a GPU, and that library is in the nvidia-cuda-runtime wheel, not
# on the loader's path. This puts it there and runs the real binary, so `perf_analyzer ...` runs
# as Triton's documentation shows it.
here=$(dirname "$(readlink -f "$0")")
cuda=$(ls -d "$here"/../lib/python3*/site-packages/nvidia/cuda_runtime/lib 2>/dev/null | head -n 1)
LD_LIBRARY_PATH="$cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/perf_analyzer.bin" "$@"
