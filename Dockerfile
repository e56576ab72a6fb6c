# tritonnx on the Triton server container (make images: tag tritonnx:ngc). The image keeps NGC's
# tritonserver, Python backend and native onnxruntime backend and adds the backend package, the
# Python-based backend `tritonnx` (`backend: "tritonnx"` picks it; `onnxruntime` stays NVIDIA's),
# the supervisor, the facade, their pinned dependencies and the demo model repository.
#
# With NVIDIA's registry (the image's Python is 3.10, so its wheelhouse is too):
#   make wheelhouse WHEEL_PYTHON=3.10
#   docker build -t tritonnx:ngc --build-arg WHEELHOUSE=build/wheelhouse/py3.10 .
# Without it, `make images` builds this file on a stand-in with NGC's layout and Python 3.11
# (deploy/docker/Dockerfile.standin says what it reproduces and what it does not).
#
#   docker run -d --name triton --init --ipc shareable --shm-size 512m -p 50051:50051 -p 3000:3000 \
#     -e TRITONNX_ADMIN_KEY=... tritonnx:ngc
#   docker run -d --init --network container:triton --ipc container:triton \
#     -e TRITONNX_ADMIN_KEY=... -e TRITONNX_AUTH_TOKEN=... tritonnx:ngc tritonnx-facade
# Triton's ports stay on the container's loopback; the facade, on every address, wants its token.
#
# What this file assumes of the NGC image, each checked by the stand-in: tritonserver at
# /opt/tritonserver/bin, the Python backend with its stub in /opt/tritonserver/backends/python,
# python3 with pip, the user triton-server with uid 1000. Packages go to /opt/tritonnx/site-packages,
# put first on the system Python's path (the stub's too) by a .pth file, so they win over the
# numpy NGC installs; nothing NGC ships is changed (its Python backend's folder gains `backend/`,
# the import path of model.py files published before the `tritonnx` namespace, for one release).
# NGC has no tini: run with --init.
ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3
ARG WHEELHOUSE=build/wheelhouse/py3.10

FROM ${BASE_IMAGE} AS packages
ARG WHEELHOUSE
COPY ${WHEELHOUSE} /wheelhouse
RUN python3 -m pip install --no-index --no-deps --no-cache-dir --quiet --find-links /wheelhouse \
        --target /opt/tritonnx/site-packages -r /wheelhouse/requirements-image.txt /wheelhouse/tritonnx-*.whl \
    && rm -f /opt/tritonnx/site-packages/bin/perf_analyzer /opt/tritonnx/site-packages/bin/perf_client

# The demo models, generated with the same seeded code as `make models` (onnx stays in this stage).
FROM packages AS models
RUN python3 -m pip install --no-index --no-deps --no-cache-dir --quiet --find-links /wheelhouse \
        --target /tmp/models-tools -r /wheelhouse/requirements-models.txt
COPY model_repository/ /models/
RUN PYTHONPATH=/opt/tritonnx/site-packages:/tmp/models-tools python3 -m tritonnx.offline.demo_models --repository /models >/dev/null

FROM ${BASE_IMAGE}
COPY --from=packages /opt/tritonnx/ /opt/tritonnx/
COPY --from=models /models/ /models/
RUN python3 -c "import pathlib, site; pathlib.Path(site.getsitepackages()[0], 'tritonnx.pth').write_text('import sys; sys.path.insert(0, \"/opt/tritonnx/site-packages\")\n')" \
    && python3 -c "from pathlib import Path; from tritonnx.server.triton import install_onnx_backends, \
install_legacy_backend; install_onnx_backends(Path('/opt/tritonserver/backends'), ('tritonnx',)); \
install_legacy_backend(Path('/opt/tritonserver/backends/python'))" \
    && mkdir -p /tmp/tritonnx/ort-cache && chown -R triton-server:triton-server /tmp/tritonnx
ENV PATH=/opt/tritonnx/site-packages/bin:${PATH} \
    TRITONNX_TRITON_HOME=/opt/tritonserver \
    TRITONNX_MODEL_REPOSITORY=/models \
    TRITONNX_BUILD_DIR=/tmp/tritonnx \
    TRITONNX_ORT_CACHE_DIR=/tmp/tritonnx/ort-cache \
    TRITONNX_HOST=0.0.0.0
USER triton-server
EXPOSE 50051 3000
CMD ["tritonnx-serve", "--no-facade", "--log-dir", "-"]
