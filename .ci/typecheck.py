"""mypy over pyproject.toml's `files`, with `backend/` and `client/` named as they install.

mypy names a file by its folders (`backend/runner.py` is `backend.runner`) and cannot follow
setuptools' `package-dir`, so it would not find `tritonnx.backend.runner`: this hands it the
configured sources under their installed names. Arguments go to mypy as on its command line.
"""

from __future__ import annotations

import sys

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

# The folders of pyproject.toml's [tool.setuptools.package-dir].
INSTALLED_AS = {"backend": "tritonnx.backend", "client": "tritonnx.client"}


def installed_name(source: BuildSource) -> BuildSource:
    top, _, rest = (source.module or "").partition(".")
    if top not in INSTALLED_AS:
        return source
    module = INSTALLED_AS[top] + (f".{rest}" if rest else "")
    return BuildSource(source.path, module, source.text, source.base_dir, source.followed)


def main(argv: list[str]) -> int:
    sources, options = process_options(argv)
    # Whole runs: mypy's incremental cache looks modules up by their folder names again, and then misses
    # the renamed ones (a submodule read as a missing attribute).
    options.incremental = False
    try:
        messages = build.build([installed_name(source) for source in sources], options).errors
    except CompileError as error:  # a blocking error: a syntax error, a module found twice
        messages = error.messages
    return report(messages, len(sources))


def report(messages: list[str], checked: int) -> int:
    for line in messages:
        print(line)
    errors = [line for line in messages if ": error:" in line]
    if errors:
        print(f"Found {len(errors)} errors (checked {checked} source files)")
        return 1
    print(f"Success: no issues found in {checked} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
