"""Settings from flags, then environment variables, then defaults (client/facade/settings.py): the facade's, and
the mechanism tritonnx-serve's settings share."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from tritonnx.client.facade.settings import FacadeSettings, add_arguments, from_arguments
from tritonnx.common.settings import add_flags, setting, settings_from


def test_settings_come_from_flags_then_environment_then_defaults(monkeypatch):
    monkeypatch.setenv("TRITONNX_MAX_IN_FLIGHT", "7")
    monkeypatch.setenv("TRITONNX_DEFAULT_MODEL", "mobilenet_v3_small")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = from_arguments(parser.parse_args(["--default-model", "text_classifier", "--health-interval", "0.5"]))
    assert settings.max_in_flight == 7 and settings.default_model == "text_classifier"
    assert settings.health_interval == 0.5 and settings.port == FacadeSettings.port


def test_boolean_settings_and_a_token_that_help_never_prints(monkeypatch):
    monkeypatch.setenv("TRITONNX_AUTH_TOKEN", "hunter2")
    monkeypatch.setenv("TRITONNX_REFLECTION", "off")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = from_arguments(parser.parse_args([]))
    assert settings.auth_token == "hunter2" and settings.reflection is False
    assert from_arguments(parser.parse_args(["--reflection", "1"])).reflection is True
    assert "hunter2" not in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--reflection", "maybe"])


@dataclass(frozen=True)
class Example:
    size: int = setting(3, "how many")
    place: Path = setting(factory=lambda: Path("/srv"), help="where", env="EXAMPLE_PLACE", flags=("--place", "--dir"))
    names: tuple[str, ...] = setting(("*",), "a name, repeatable", env="EXAMPLE_NAMES")
    loud: bool = setting(False, "a switch", env=False)
    hidden: str = setting("", argparse.SUPPRESS, env=False, flags=("--hidden_name",))


def example(argv: list[str]) -> tuple[Example, str]:
    parser = argparse.ArgumentParser(formatter_class=lambda prog: argparse.HelpFormatter(prog, width=500))
    add_flags(parser, Example)
    return settings_from(parser.parse_args(argv), Example), parser.format_help()


def test_each_field_is_a_flag_with_its_environment_variable_and_default_in_its_help(monkeypatch):
    for name in ("TRITONNX_SIZE", "EXAMPLE_PLACE", "EXAMPLE_NAMES"):
        monkeypatch.delenv(name, raising=False)
    settings, help_text = example([])
    assert settings == Example(3, Path("/srv"), ("*",), False, "")
    assert "how many (env TRITONNX_SIZE; default: 3)" in help_text
    assert "--place PLACE, --dir PLACE" in help_text and "(env EXAMPLE_PLACE; default: /srv)" in help_text
    assert "(env EXAMPLE_NAMES, comma-separated; default: *)" in help_text
    assert "--loud, --no-loud" in help_text and "a switch (default: off)" in help_text
    assert "hidden" not in help_text


def test_flags_beat_the_environment_which_beats_the_defaults_and_an_empty_variable_is_unset(monkeypatch):
    monkeypatch.setenv("TRITONNX_SIZE", "")
    monkeypatch.setenv("EXAMPLE_PLACE", "/data")
    monkeypatch.setenv("EXAMPLE_NAMES", "a,b")
    assert example([])[0] == Example(3, Path("/data"), ("a", "b"), False, "")
    flagged = example(["--size", "5", "--dir", "/x", "--names", "c", "--names", "d", "--loud", "--hidden_name", "n"])
    assert flagged[0] == Example(5, Path("/x"), ("c", "d"), True, "n")  # repeated flags replace the default


def test_a_bad_value_is_a_usage_error():
    with pytest.raises(SystemExit):
        example(["--size", "many"])
