"""tritonnx-serve's flags (tritonnx/commands/serve.py): its settings, their environment variables, KServe's spellings, and
the facade's flags after `--`. The command itself runs in tests/integration/test_serve.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tritonnx.commands.serve import ServeSettings, arguments
from tritonnx.common.settings import env_of, settings_from

ENVIRONMENT = {
    "model_repository": "TRITONNX_MODEL_REPOSITORY",
    "host": "TRITONNX_TRITON_HOST",
    "http_host": "TRITONNX_TRITON_HTTP_HOST",
    "metrics_host": "TRITONNX_TRITON_METRICS_HOST",
    "http_port": "TRITONNX_TRITON_HTTP_PORT",
    "grpc_port": "TRITONNX_TRITON_GRPC_PORT",
    "metrics_port": "TRITONNX_TRITON_METRICS_PORT",
    "supervisor_metrics_port": "TRITONNX_SUPERVISOR_METRICS_PORT",
    "log_verbose": "TRITONNX_TRITON_LOG_VERBOSE",
    "otlp_endpoint": "TRITONNX_OTLP_ENDPOINT",
    "trace_ratio": "TRITONNX_TRACE_RATIO",
    "load_model": "TRITONNX_TRITON_LOAD_MODELS",
    "watchdog_seconds": "TRITONNX_WATCHDOG_SECONDS",
}


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    for name in ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)


def parse(argv: list[str]) -> tuple[ServeSettings, list[str]]:
    parsed = arguments().parse_args(argv)
    return settings_from(parsed, ServeSettings), parsed.facade_args


def test_every_environment_variable_keeps_its_name():
    assert {f.name: env_of(f) for f in dataclasses.fields(ServeSettings) if env_of(f)} == ENVIRONMENT


def test_the_defaults_are_triton_on_its_usual_ports_with_every_model_and_the_facade():
    settings, facade_args = parse([])
    assert (settings.host, settings.http_port, settings.grpc_port, settings.metrics_port) == (
        "127.0.0.1",
        8000,
        8001,
        8002,
    )
    assert (settings.supervisor_metrics_port, settings.log_verbose, settings.otlp_endpoint) == (8003, 0, "")
    assert settings.load_model == ("*",) and settings.triton_http and settings.facade and facade_args == []


def test_kserve_spellings_are_taken_and_its_model_name_and_workers_are_not_shown():
    settings, _ = parse(["--model_dir", "/mnt/models", "--http_port", "8080", "--grpc_port", "8081",
                         "--model_name", "my-model", "--workers", "4"])  # fmt: skip
    assert (settings.model_repository, settings.http_port, settings.grpc_port) == (Path("/mnt/models"), 8080, 8081)
    assert (settings.model_name, settings.workers) == ("my-model", "4")
    help_text = arguments().format_help()
    assert "--model_name" not in help_text and "--workers" not in help_text and "--model_dir" in help_text


def test_the_environment_sets_what_no_flag_says(monkeypatch):
    monkeypatch.setenv("TRITONNX_TRITON_LOAD_MODELS", "resnet50,mobilenet_v3_small")
    monkeypatch.setenv("TRITONNX_TRITON_HOST", "0.0.0.0")
    monkeypatch.setenv("TRITONNX_SUPERVISOR_METRICS_PORT", "-1")
    monkeypatch.setenv("TRITONNX_TRACE_RATIO", "0.5")
    settings, _ = parse(["--load-model", "text_classifier"])
    assert settings.load_model == ("text_classifier",)  # the flag replaces the variable's list
    assert (settings.host, settings.supervisor_metrics_port, settings.trace_ratio) == ("0.0.0.0", -1, 0.5)
    assert parse([])[0].load_model == ("resnet50", "mobilenet_v3_small")


def test_switches_and_the_facades_flags_after_the_double_dash():
    settings, facade_args = parse(["--no-facade", "--no-triton-http", "--", "--http-port", "4000", "--port", "0"])
    assert not settings.facade and not settings.triton_http
    assert facade_args == ["--http-port", "4000", "--port", "0"]  # the facade's, not Triton's --http-port
    assert parse(["--http-port", "9000"])[0].http_port == 9000


def test_help_names_each_variable_and_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    help_text = arguments().format_help()
    assert "Triton's HTTP port (env TRITONNX_TRITON_HTTP_PORT; default: 8000)" in help_text
    assert "(env TRITONNX_TRITON_LOAD_MODELS, comma-separated; default: *)" in help_text
    assert "--facade, --no-facade" in help_text and "see tritonnx-facade --help" in help_text


def test_a_flag_it_does_not_take_is_a_usage_error():
    with pytest.raises(SystemExit) as caught:
        parse(["--no-such-flag"])
    assert caught.value.code == 2
