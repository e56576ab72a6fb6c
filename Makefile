# tritonnx: `make serve` and `make test` work on a fresh machine; everything they need is
# installed by the targets below (apt packages, the venv, the generated models).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_SYSTEM ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The stub's libpython, perf_analyzer's libb64, Prometheus and promtool for the monitoring stack, ip and nft for the
# network-fault tests (Triton in a namespace of their own), curl for the docs' recipes (run by the tests), perf for
# tritonserver's native frames in the profile study (bench/studies/profile.py), libnghttp2-dev for the benchmark's
# compiled load generator (bench/load/loadgen.c).
APT_PACKAGES := libpython3.11 libb64-0d prometheus iproute2 nftables curl linux-perf libnghttp2-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
MODELS := resnet50 mobilenet_v3_small text_classifier token_classifier
ONNX_FILES := $(foreach m,$(MODELS),model_repository/$(m)/1/model.onnx)
PROTO_OUT := client/proto/inference_pb2.py client/proto/inference_pb2.pyi client/proto/inference_pb2_grpc.py
PYTEST_ARGS ?=
BENCH_ARGS ?=
PEERS_ARGS ?=
TUNE_ARGS ?=
SOAK_ARGS ?=
CHAOS_ARGS ?=
# The fuzz campaign's wall clock in `make chaos` (make test runs it for 20 s; tests/fuzz.py).
CHAOS_FUZZ_SECONDS ?= 600
CONFORMANCE_ARGS ?=
MONITOR_ARGS ?=
SERVE_ARGS ?=
WHEEL_PYTHON ?= 3.11
BASE_IMAGE ?=

.PHONY: help setup apt venv proto models serve traces monitor lint format test test-slow test-containers unit bench bench-peers tune soak chaos conformance test-conformance docker-engine wheelhouse images clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

setup: venv proto models ## Install everything, generate the protobuf code and the models (serve and test do this first)
	@# Commit subjects of at most 72 characters (.githooks/commit-msg), in a git checkout of this project only.
	@if [ "$$(git rev-parse --show-toplevel 2>/dev/null)" = "$(CURDIR)" ]; then git config core.hooksPath .githooks; fi

apt: ## Install the Debian packages: the stub's libpython3.11, perf_analyzer's libb64, prometheus (not started as a service), iproute2, nftables, curl and perf
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo ">> apt-get install $$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

venv: apt $(STAMP) ## Create .venv with the pinned Python dependencies and tritonserver 2.51

$(STAMP): requirements.txt requirements-serving.txt requirements-dev.txt requirements-triton.txt bench/requirements-bench.txt deploy/docker/requirements-image.txt deploy/docker/requirements-models.txt pyproject.toml
	@echo ">> creating $(VENV) with pinned dependencies (first run: a few minutes)"
	@[ -x $(PY) ] || $(PYTHON_SYSTEM) -m venv $(VENV)
	@# The image's pins hold the transitive dependencies too (packaging, attrs, ...): the venv runs what the images run.
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt -r bench/requirements-bench.txt -c deploy/docker/requirements-image.txt -c deploy/docker/requirements-models.txt 2>&1 | grep -v '^WARNING: Location' ; exit $${PIPESTATUS[0]}
	@# Only the server binary and Python backend files of the wheel are used (see the file).
	$(PY) -m pip install --quiet --no-deps -r requirements-triton.txt 2>&1 | grep -v '^WARNING: Location' ; exit $${PIPESTATUS[0]}
	@# This checkout, editable: the Python stub finds `tritonnx` in the venv wherever tritonserver starts.
	$(PY) -m pip install --quiet --no-deps -e . 2>&1 | grep -v '^WARNING: Location' ; exit $${PIPESTATUS[0]}
	@# perf_analyzer needs the CUDA runtime wheel's libcudart on its path (see the wrapper).
	@if head -c 4 $(VENV)/bin/perf_analyzer | grep -q ELF; then mv $(VENV)/bin/perf_analyzer $(VENV)/bin/perf_analyzer.bin; fi
	install -m 755 bench/perf_analyzer.sh $(VENV)/bin/perf_analyzer
	@touch $@

proto: $(PROTO_OUT) ## Generate the Python code (and its type stub) of client/proto/inference.proto (committed; a unit test compares)

$(PROTO_OUT) &: client/proto/inference.proto | $(STAMP)
	@# Compiled by its installed path, tritonnx/client/proto, which names the generated modules' imports.
	@rm -rf build/proto && mkdir -p build/proto
	$(PY) -m grpc_tools.protoc -Itritonnx/client/proto=client/proto --python_out=build/proto --pyi_out=build/proto --grpc_python_out=build/proto client/proto/inference.proto
	cp build/proto/tritonnx/client/proto/inference_pb2* client/proto/

models: venv ## Generate the demo ONNX models (seeded random weights; cached after the first run)
	$(PY) -m tritonnx.offline.demo_models --repository model_repository $(MODELS)

serve: setup ## Serve: tritonserver on 127.0.0.1 (HTTP 8000, gRPC 8001, metrics 8002) and the facade (gRPC 50051, HTTP 3000) (SERVE_ARGS=...)
	$(PY) -m tritonnx.commands.serve $(SERVE_ARGS)

traces: venv ## Print OpenTelemetry traces received on 127.0.0.1:4318 (beside make serve SERVE_ARGS="--otlp-endpoint http://127.0.0.1:4318")
	$(PY) -m tritonnx.commands.traces

monitor: venv ## Prometheus on 127.0.0.1:9090 scraping a running `make serve` (Triton, facade, supervisor), with deploy/monitoring's rules
	$(PY) -m tritonnx.commands.monitor $(MONITOR_ARGS)

lint: venv proto ## ruff (lint and format check), mypy (the package, bench/, the test helpers), commit subjects; `make format` rewrites
	$(PY) -m ruff check backend client tritonnx bench tests .ci
	$(PY) -m ruff format --check backend client tritonnx bench tests .ci
	$(PY) .ci/typecheck.py
	$(PY) .githooks/commit-msg --history

format: venv ## Format the code and apply ruff's safe fixes
	$(PY) -m ruff format backend client tritonnx bench tests .ci
	$(PY) -m ruff check --fix backend client tritonnx bench tests .ci

# The inner loop: unit tests (no server, on every core), then integration tests against real tritonservers.
# Behaviour only: speed, rejection rates and fault timings are gates of bench, chaos and soak.
test: setup ## Run the tests: unit, then integration against real tritonservers (a few minutes)
	$(PY) -m pytest $(PYTEST_ARGS) -n auto tests/unit
	$(PY) -m pytest $(PYTEST_ARGS) tests/integration

test-slow: setup ## The slow tier: faults, overload, replicas, versions under load, monitoring, benchmark smoke runs
	$(PY) -m pytest $(PYTEST_ARGS) tests/slow

test-containers: setup ## Build the images (the engine installed and started if needed) and test them in real containers
	$(PY) -m pytest $(PYTEST_ARGS) tests/containers

unit: venv proto models ## Run the unit tests only (no server, seconds; the demo models generated once)
	$(PY) -m pytest $(PYTEST_ARGS) -n auto tests/unit

bench: setup ## Benchmark: limit, Triton direct, facade, FastAPI baseline, PyTriton (BENCH_ARGS="--models mobilenet_v3_small ...")
	$(PY) -m bench $(BENCH_ARGS)

bench-peers: setup ## Every server beside the limit: tritonnx, FastAPI, PyTriton, Ray Serve, MLServer (venvs under build/peers/; ~25 min; PEERS_ARGS="--smoke"; "--open-loop": goodput at a latency objective, Poisson arrivals)
	$(PY) -m bench.peers $(PEERS_ARGS)

tune: setup ## Pick a model's policy by open-loop goodput at its latency objective, into its config.pbtxt (MODEL=..., TUNE_ARGS=...)
	@[ -n "$(MODEL)" ] || { echo "usage: make tune MODEL=mobilenet_v3_small [TUNE_ARGS='--instances 1 2 3']"; exit 2; }
	$(PY) -m bench.tune --model $(MODEL) $(TUNE_ARGS)

soak: setup ## An hour at 70% of capacity, every demo model through both paths, a version publish every 10 min: memory, fds, threads, /dev/shm gated (SOAK_ARGS=...)
	$(PY) -m bench.soak $(SOAK_ARGS)

chaos: setup ## 3x capacity for 60 s per path (CHAOS_ARGS=...), then the fault tests: stub kill -9, Triton SIGKILL/SIGTERM, a hanging model, network faults, then 10 minutes of fuzzing (CHAOS_FUZZ_SECONDS), then the attack campaign against the facade's defaults while a probe is served, judged and reported, without a token and with one the attackers hold (bench.attacks, ~10 min each; ATTACKS_ARGS=...)
	$(PY) -m bench.overload $(CHAOS_ARGS)
	$(PY) -m pytest -s -q --gates tests/slow/test_faults.py tests/slow/test_overload.py tests/slow/test_network_faults.py
	FUZZ_SECONDS=$(CHAOS_FUZZ_SECONDS) $(PY) -m pytest -s -q --gates tests/integration/test_fuzz.py tests/integration/test_fuzz_kserve.py
	$(PY) -m bench.attacks $(ATTACKS_ARGS)
	$(PY) -m bench.attacks --token $(ATTACKS_ARGS)

conformance: setup ## Serve ONNX's ~1,400 test models and the exporters' corpus through tritonserver, every output checked (CONFORMANCE_ARGS=--corpus onnx|exported; the exporters' venv takes ~9 GB)
	$(PY) -m tests.conformance $(CONFORMANCE_ARGS)

test-conformance: setup ## The conformance tier: 26 of ONNX's models, 5 exporters' models (tests/conformance/exports), the command at its smallest
	$(PY) -m pytest $(PYTEST_ARGS) tests/conformance

docker-engine: ## Install (Debian's docker.io) and start the Docker engine when none answers
	deploy/docker/images.sh engine

wheelhouse: venv proto ## Every package the images install, as wheels in build/wheelhouse/py$(WHEEL_PYTHON) (WHEEL_PYTHON=3.10 for NGC)
	WHEEL_PYTHON=$(WHEEL_PYTHON) deploy/docker/images.sh wheelhouse

images: venv proto ## Build tritonnx:cpu (slim, no models), tritonnx:demo (with the demo models) and tritonnx:ngc (on BASE_IMAGE, else a stand-in with NGC's layout)
	WHEEL_PYTHON=$(WHEEL_PYTHON) $(if $(BASE_IMAGE),BASE_IMAGE=$(BASE_IMAGE)) deploy/docker/images.sh all

clean: ## Remove the venv, build outputs and generated models
	rm -rf $(VENV) build $(ONNX_FILES)
