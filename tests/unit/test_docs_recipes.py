"""Every code block of README.md and docs/*.md says what it is, and what a user runs is run or checked.

The convention is in tests/docs_blocks.py. Here: each block has a kind and, when runnable, a marker; each
`check` and `containers` block's commands exist (a make target, a module, a console script whose parser takes
the arguments); each `protobuf` block is a ModelConfig; the metrics page lists every metric the processes
export. tests/slow/test_docs_recipes.py runs the `run` blocks, tests/containers/test_docs_recipes.py the
`containers` ones.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.docs_blocks import CHECKOUT, KINDS, RUNNABLE, Block, all_blocks, blocks, commands

BLOCKS = all_blocks()
# Programs a `check` block may name without more checking: the container tier (tests/containers) runs the images,
# and tests/unit/test_deploy_*.py render the manifests these commands apply.
OUTSIDE_TOOLS = {
    "docker",
    "docker-compose",
    "kubectl",
    "export",
    "openssl",
    "curl",
    "mkdir",
    "cp",
    "echo",
    "printf",
    "timeout",
}
ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


def _parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    from tritonnx.client import triton_health, triton_infer
    from tritonnx.commands import models, serve

    return {
        "tritonnx.commands.models": models.build_parser,
        "tritonnx.commands.serve": serve.arguments,
        "tritonnx.client.triton_health": triton_health.build_parser,
        "tritonnx.client.triton_infer": triton_infer.build_parser,
    }


CONSOLE_SCRIPTS = {
    "tritonnx-models": "tritonnx.commands.models",
    "tritonnx-serve": "tritonnx.commands.serve",
    "tritonnx-facade": "tritonnx.client.facade",
}


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (CHECKOUT / "Makefile").read_text(), re.MULTILINE))


def parses(module: str, args: list[str]) -> str:
    """'' when the module's own parser takes `args`, else why not."""
    parser = _parsers().get(module)
    if parser is None:
        return "" if importlib.util.find_spec(module) else f"no module {module}"
    try:
        parser().parse_args(args)
    except SystemExit as error:
        return "" if error.code == 0 else f"{module} refuses {shlex.join(args)}"
    return ""


def command_problem(command: str) -> str:
    """'' when the command names what exists and its arguments parse; else what is wrong."""
    words = [w for w in shlex.split(command, comments=True) if w != "&"]
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words:
        return ""
    program, args = Path(words[0]).name, words[1:]
    if program == "make":
        targets = [a for a in args if not ASSIGNMENT.match(a)]
        missing = [t for t in targets if t not in make_targets()]
        return f"no make target {missing}" if missing else ""
    if program in ("python", "python3") and args[:1] == ["-m"]:
        return parses(args[1], args[2:])
    if program in CONSOLE_SCRIPTS:
        return parses(CONSOLE_SCRIPTS[program], args)
    if program == "perf_analyzer" or program in OUTSIDE_TOOLS:
        return ""
    return f"{program}: not a command the docs test knows (run the block, or add the program here with its reason)"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_every_block_says_what_it_is(block: Block):
    assert block.kind in KINDS, f"{block.id}: a fence says what it holds, one of {KINDS}, not {block.kind!r}"
    if block.kind in RUNNABLE:
        assert block.marker, f"{block.id}: a {block.kind} block follows <!-- test: run --> or <!-- test: check -->"
    else:
        assert not block.marker, f"{block.id}: a {block.kind} block is not run"


# The container tier runs its blocks; checking their commands here too shows a wrong one without building images.
CHECKED = [b for b in BLOCKS if b.marker in ("check", "containers")]


@pytest.mark.parametrize("block", CHECKED, ids=lambda b: b.id)
def test_a_checked_block_names_commands_that_exist_with_arguments_they_take(block: Block):
    if block.kind == "python":
        compile(block.text, block.id, "exec")
        return
    problems = [f"{c!r}: {p}" for c in commands(block) if (p := command_problem(c))]
    assert not problems, f"{block.id}: {problems}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "protobuf"], ids=lambda b: b.id)
def test_a_config_block_is_a_model_config(block: Block):
    text_format.Parse(block.text, model_config_pb2.ModelConfig())


def test_the_console_scripts_the_docs_name_answer_help():
    named = {Path(c.split()[0]).name for b in BLOCKS if b.kind == "bash" and b.marker for c in commands(b)}
    for script in sorted(named & set(CONSOLE_SCRIPTS)):
        done = subprocess.run(
            [sys.executable, "-m", CONSOLE_SCRIPTS[script], "--help"], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"{script} --help: {done.stderr}"


def test_the_metrics_page_lists_every_metric_the_processes_export():
    from tritonnx.client.facade.metrics import FacadeMetrics
    from tritonnx.server.metrics import SupervisorMetrics

    page = (CHECKOUT / "docs" / "metrics.md").read_text()
    exported = set()
    for metrics in (FacadeMetrics(), SupervisorMetrics()):
        for family in metrics.registry.collect():
            exported.add(family.name + ("_total" if family.type == "counter" else ""))
    missing = sorted(name for name in exported if f"`{name}`" not in page)
    assert not missing, f"docs/metrics.md does not list {missing}"


def test_the_extraction_reads_kinds_markers_and_commands(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n<!-- test: run exit=1 -->\n```bash\nmake \\\n  serve  # a comment\n# only a comment\n```\n\n"
        "- a list item:\n\n  ```protobuf\n  max_batch_size: 4\n  ```\n"
    )
    shell, config = blocks(page)
    assert (shell.kind, shell.marker, shell.exit_code, shell.line) == ("bash", "run", 1, 4)
    assert commands(shell) == ["make    serve  # a comment"]
    assert (config.kind, config.marker, config.text) == ("protobuf", "", "max_batch_size: 4\n")
    assert command_problem("make serve SERVE_ARGS='--x'") == "" and "no make target" in command_problem("make nope")
    assert command_problem(".venv/bin/tritonnx-models publish m f.onnx --quantize static") == ""
    assert "refuses" in command_problem(".venv/bin/tritonnx-models publish m f.onnx --quantize never")
    assert "not a command" in command_problem("rm -rf model_repository")
