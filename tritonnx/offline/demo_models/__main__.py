"""Command line: generate the demo ONNX models into a Triton model repository."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from tritonnx.offline.demo_models import DEFAULT_SEED, MODELS, generate


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (sys.argv[1:] when `argv` is None)."""
    parser = argparse.ArgumentParser(
        prog="python -m tritonnx.offline.demo_models",
        description=(
            "Build the demo ONNX models (opset 17) with seeded random weights and write each to "
            "<repository>/<name>/1/model.onnx. Nothing is downloaded; the same seed always gives "
            "the same model."
        ),
        epilog=f"models: {', '.join(MODELS)}",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="models to build (default: all)",
    )
    parser.add_argument(
        "--repository",
        type=Path,
        required=True,
        help="model repository directory, e.g. model_repository",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="rebuild models whose model.onnx already exists (default: keep them)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=(
            f"random seed for the weights (default: {DEFAULT_SEED}); cached models keep theirs, "
            "add --force to rebuild them with a new seed"
        ),
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)} (choose from {', '.join(MODELS)})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = parse_args(argv)
    # Flush each line so progress shows up live even when stdout is a pipe (make, docker build).
    log = functools.partial(print, flush=True)
    generate(args.repository, args.names or None, args.force, seed=args.seed, log=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
