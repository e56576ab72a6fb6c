# tritonnx on the Triton container: the same backend package, pinned versions and model
# repository layout as `make serve`, with the container's own tritonserver and Python backend.
#   docker build -t tritonnx .   (add --build-arg BASE_IMAGE=... for another Triton image)
#   docker run --rm --network host tritonnx
ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3

# Stage 1: generate the demo models (seeded random weights) unless model_repository already
# holds an .onnx file for a model; the generator skips those.
FROM ${BASE_IMAGE} AS models
WORKDIR /build
COPY requirements-serving.txt ./
RUN python3 -m pip install --no-cache-dir -r requirements-serving.txt onnx==1.19.1 protobuf==4.25.8
COPY backend/ backend/
COPY model_repository/ model_repository/
RUN python3 -m backend.demo_models --repository model_repository

# Stage 2: the serving image.
FROM ${BASE_IMAGE}
WORKDIR /opt/tritonnx
COPY requirements-serving.txt pyproject.toml README.md ./
RUN python3 -m pip install --no-cache-dir -r requirements-serving.txt
COPY backend/ backend/
COPY client/ client/
RUN python3 -m pip install --no-cache-dir --no-deps .
COPY --from=models /build/model_repository/ model_repository/

EXPOSE 8000 8001 8002
# Same server flags as backend/tritonserver.py: whole batches travel through the Python
# backend's shared memory, so start the region large enough for a 16-image batch; explicit model
# control and the administrative APIs behind the key in $TRITONNX_ADMIN_KEY (required).
ENV RESTRICTED=model-repository,model-config,shared-memory,statistics,trace,logging
CMD ["sh", "-c", "exec tritonserver \
     --model-repository=/opt/tritonnx/model_repository \
     --backend-config=python,shm-default-byte-size=16777216 \
     --backend-config=python,shm-growth-byte-size=16777216 \
     --exit-timeout-secs=10 \
     --model-control-mode=explicit --load-model='*' \
     --grpc-restricted-protocol=${RESTRICTED}:tritonnx-admin-key=${TRITONNX_ADMIN_KEY:?set TRITONNX_ADMIN_KEY} \
     --http-restricted-api=${RESTRICTED}:tritonnx-admin-key=${TRITONNX_ADMIN_KEY}"]
