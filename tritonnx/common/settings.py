"""Settings as frozen dataclasses, filled from flags, then environment variables, then defaults.

One mechanism for the settings of every tritonnx process (the facade's `FacadeSettings`, `tritonnx-serve`'s
`ServeSettings`): each field is declared with `setting(...)`, which holds its default, its help, its environment
variable and its flags, so each is written once. `add_flags` gives a parser one flag per field, its default taken
from the environment when set there (an empty variable counts as unset); `settings_from` builds the dataclass from
the parsed flags.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ENV_PREFIX = "TRITONNX_"
S = TypeVar("S", bound="DataclassInstance")
_NAMES = "tuple[str, ...]"  # the annotation of a repeatable setting


def setting(
    default: Any = MISSING,
    help: str = "",  # noqa: A002 - argparse's name for it
    *,
    factory: Callable[[], Any] | None = None,
    env: str | bool = True,
    flags: tuple[str, ...] = (),
    secret: bool = False,
) -> Any:
    """A settings field: its `default` (or `factory()`) and `help` (argparse.SUPPRESS: a flag taken, not shown).

    `env`: its environment variable (True: TRITONNX_<NAME>; False: none). `flags`: its flags (none given:
    --<name-with-dashes>). A `secret` never shows in --help. A bool with an environment variable takes a value, as
    the variable does (--reflection 0); one without is a switch (--facade / --no-facade). A tuple of strings is a
    repeatable flag, comma-separated in its variable.
    """
    metadata = {"help": help, "env": env, "flags": flags, "secret": secret}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def env_name(field_name: str) -> str:
    """The environment variable named after a setting: TRITONNX_<NAME>."""
    return ENV_PREFIX + field_name.upper()


def env_of(item: Field) -> str | None:
    """The environment variable of a setting, or None."""
    env = item.metadata["env"]
    return env_name(item.name) if env is True else env or None


def _boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "on", "yes"):
        return True
    if lowered in ("0", "false", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected 1/0 or true/false, got {value!r}")


def _names(value: str) -> tuple[str, ...]:
    return tuple(filter(None, (name.strip() for name in value.split(","))))


class _Repeated(argparse.Action):
    """A repeatable flag whose values replace its default (argparse's "append" would add to it)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest)
        setattr(namespace, self.dest, (values,) if current is self.default else (*current, values))


# A setting's annotation (a string under `from __future__ import annotations`) -> the parser of its text.
_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": _boolean,
    "Path": Path,
    _NAMES: _names,
}


def _help(item: Field, env: str | None, default: Any) -> str:
    text = item.metadata["help"]
    if text == argparse.SUPPRESS:
        return text
    where = f"env {env}{', comma-separated' if str(item.type) == _NAMES else ''}; " if env else ""
    if item.metadata["secret"]:
        return f"{text} ({where}never shown)"
    return f"{text} ({where}default: {_shown(default)})"


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        value = ",".join(value)
    return (str(value) or "none").replace("%", "%%")  # help texts are %-formatted


def add_flags(parser: argparse.ArgumentParser, settings: type[DataclassInstance]) -> None:
    """One flag per field of the `settings` dataclass; its default comes from the environment when set there."""
    for item in fields(settings):
        kind = str(item.type)
        env = env_of(item)
        env_value = os.environ.get(env) if env else None
        default = _PARSERS[kind](env_value) if env_value else _default(item)
        options: dict[str, Any] = {"default": default, "dest": item.name, "help": _help(item, env, default)}
        if kind == "bool" and not env:
            options["action"] = argparse.BooleanOptionalAction
        elif kind == _NAMES:
            options["action"] = _Repeated
        else:
            options["type"] = _PARSERS[kind]
        parser.add_argument(*(item.metadata["flags"] or ("--" + item.name.replace("_", "-"),)), **options)


def _default(item: Field) -> Any:
    return item.default_factory() if item.default_factory is not MISSING else item.default


def settings_from(namespace: argparse.Namespace, settings: type[S]) -> S:
    """The `settings` dataclass from parsed flags (other attributes of `namespace` are left out)."""
    return settings(**{item.name: getattr(namespace, item.name) for item in fields(settings)})
