"""`tritonnx-models` publish, list, rollback and retire (tritonnx/commands/models.py) against a stand-in for Triton's
model control, Triton's messages as the commands print them, and triton_health's view of several versions."""

from __future__ import annotations

import json

import pytest

from tests.unit.graphs import RecordingControl, identity_graph, make_model
from tritonnx.client import triton_health
from tritonnx.client.model_control import READY, triton_message
from tritonnx.commands import models as models_cli
from tritonnx.server.process import free_ports


def test_tritons_tracebacks_are_cut_from_its_messages():
    reason = "Internal: ModelConfigError: unexpected protobuf wire type 6\n\nAt:\n  /b/onnx_io.py(153): _fields\n;"
    assert triton_message(f"load failed for model 'm': version 3 is at UNAVAILABLE state: {reason}") == (
        "load failed for model 'm': version 3 is at UNAVAILABLE state: Internal: ModelConfigError: unexpected "
        "protobuf wire type 6"
    )


# --- the command line -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["publish", "list", "rollback", "retire"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exited:
        models_cli.main([command, "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert f"python -m tritonnx.commands.models {command}" in shown and "Example" in shown
    assert "TRITONNX_MODEL_REPOSITORY" in shown and "TRITONNX_TRITON_URL" in shown and "TRITONNX_ADMIN_KEY" in shown


@pytest.mark.parametrize(
    "argv", [["retire", "m", "two"], ["retire", "m", "0"], ["list", "--url", "grpc://127.0.0.1:8001"], ["publish", "m"]]
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        models_cli.main(argv)
    assert exited.value.code == 2


def test_an_unreachable_triton_exits_2_and_changes_nothing(tmp_path, capsys):
    folder = make_model(tmp_path / "repo", versions=(1, 2))
    [port] = free_ports(1)
    code = models_cli.main(["rollback", "m", "--url", f"127.0.0.1:{port}", "--repository", str(tmp_path / "repo")])
    assert code == 2
    assert "cannot reach Triton at 127.0.0.1" in capsys.readouterr().err
    assert folder.versions() == [1, 2] and folder.retired() == []


def test_the_commands_print_what_they_did_and_what_serves(tmp_path):
    folder = make_model(tmp_path / "repo")
    control = RecordingControl(folder)
    printed: list[str] = []
    parser = models_cli.build_parser()
    new = identity_graph(tmp_path / "new.onnx")
    models_cli.run(parser.parse_args(["publish", "m", str(new)]), control, tmp_path / "repo", printed.append)
    assert printed[-1] == f"published {new} as version 2 of m; m serves version 2 (requests without a version: 2)"
    models_cli.run(parser.parse_args(["list"]), control, tmp_path / "repo", printed.append)
    assert printed[-1].splitlines() == [
        f"m: version_policy latest 1 ({folder.path})",
        "  version  where       Triton",
        "  1        repository  UNAVAILABLE: unloaded",
        "  2        repository  READY  <- serves requests without a version",
    ]
    models_cli.run(parser.parse_args(["rollback", "m"]), control, tmp_path / "repo", printed.append)
    assert (
        printed[-1] == "rolled back: version 2 retired to retired/2; m serves version 1 (requests without a version: 1)"
    )
    models_cli.run(parser.parse_args(["list", "--json"]), control, tmp_path / "repo", printed.append)
    listed = json.loads(printed[-1])["models"][0]
    assert listed["version_policy"] == "latest 1"
    assert [(v["version"], v["place"], v["state"], v["default"]) for v in listed["versions"]] == [
        (1, "repository", READY, True),
        (2, "retired", "UNAVAILABLE", False),
    ]


# --- discovery: triton_health with two versions side by side ------------------------------------------


class TwoVersionsClient:
    """TritonControl's interface over a model served as versions 4 and 5, after 1 to 3 were swapped out."""

    url, protocol = "127.0.0.1:8001", "grpc"

    def server_live(self) -> bool:
        return True

    server_ready = server_live

    def server_metadata(self) -> dict:
        return {"name": "triton", "version": "2.51.0", "extensions": []}

    def index(self) -> list[dict]:
        return [
            {"name": "m", "version": "3", "state": "UNAVAILABLE", "reason": "unloaded"},
            {"name": "m", "version": "4", "state": "READY"},
            {"name": "m", "version": "5", "state": "READY"},
            {"name": "m", "version": "6", "state": "UNAVAILABLE", "reason": "Internal: ModelConfigError: no graph"},
        ]

    def ready(self, name: str) -> bool:
        return True

    def metadata(self, name: str) -> dict:
        tensors = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "outputs": []}
        return {"name": name, "versions": ["4", "5"], "platform": "python", **tensors}

    def config(self, name: str) -> dict:
        return {"max_batch_size": 8}


def test_triton_health_lists_versions_side_by_side_with_the_one_serving_by_default():
    report = triton_health.check(TwoVersionsClient(), [])
    [model] = report["models"]
    assert model["default_version"] == "5"
    assert [(v["version"], v["state"]) for v in model["versions"]] == [
        ("3", "UNAVAILABLE"),
        ("4", "READY"),
        ("5", "READY"),
        ("6", "UNAVAILABLE"),
    ]
    text = triton_health.format_report(report)
    assert "  versions: 3 UNAVAILABLE, 4 READY, 5 READY, 6 UNAVAILABLE (requests without a version: 5)" in text
    assert "  reason (6): Internal: ModelConfigError: no graph" in text
    assert "unloaded" not in text  # a version swapped out needs no explaining
