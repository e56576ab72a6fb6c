"""python -m tritonnx.client.facade: the project's gRPC API on :50051, translated onto Triton's KServe v2."""

from __future__ import annotations

import argparse
import logging
import sys

import uvloop

from tritonnx.client.facade.server import StartupError, run_until_signalled, tune_allocator
from tritonnx.client.facade.settings import add_arguments, from_arguments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tritonnx-facade",
        description=(
            "Serve inference.InferenceService/Predict (client/proto/inference.proto) on gRPC and forward "
            "each call to Triton over KServe v2 gRPC. Also serves grpc.health.v1 and reflection on the "
            "gRPC port, and /metrics and /health on the HTTP port. SIGTERM drains in-flight calls. "
            "`python -m tritonnx.client.facade` is the same command."
        ),
        epilog="Example: tritonnx-facade --triton-url 127.0.0.1:8001 --default-model mobilenet_v3_small",
    )
    add_arguments(parser)
    settings = from_arguments(parser.parse_args(argv))
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_allocator()
    try:
        uvloop.run(run_until_signalled(settings))
    except StartupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
