"""The engine's exception hierarchy.

Every error the engine raises on purpose is an :class:`EngineError`; its message says
what went wrong and what the user can do about it. The CLI prints it without a traceback
and the app shows it in its error panel.

Messages name the options a user can change through :func:`option` markup rather than a
command-line flag, so each face phrases them its own way: ``str(error)`` gives the CLI's
wording (``--graph-capture off``), and the app renders the same error with the labels of
its own controls (:meth:`EngineError.render`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

OptionPhrase = Callable[[str, "str | None"], str]
"""Turns an option key (an :class:`~engine.options.ExportOptions` field name, or one of
``model``, ``preset``, ``output``, ``overwrite``, ``random_weights``, ``runtime``,
``new_tokens``, ``prompt_len``) and an optional value into the words one face uses."""

_OPTION = re.compile(r"\{opt:([a-z][a-z0-9_]*)(?:=([^{}]*))?\}")


def option(key: str, value: object = None) -> str:
    """Markup for a reference to a user-facing option inside an error message."""
    return f"{{opt:{key}}}" if value is None else f"{{opt:{key}={value}}}"


def cli_phrase(key: str, value: str | None) -> str:
    """The command line's wording of an option: ``--graph-capture off``."""
    flag = "--" + key.replace("_", "-")
    return flag if value is None else f"{flag} {value}"


def render_message(message: str, phrase: OptionPhrase = cli_phrase) -> str:
    """A message with option markup (an error's, or a plan warning) in one face's words."""
    return _OPTION.sub(lambda m: phrase(m.group(1), m.group(2)), message)


def option_keys(message: str) -> set[str]:
    """The option keys a raw message refers to (for tests that check every face has words)."""
    return {match.group(1) for match in _OPTION.finditer(message)}


class EngineError(Exception):
    """Base class for every error the engine raises on purpose."""

    @property
    def raw(self) -> str:
        """The message with its option markup, as raised."""
        return str(self.args[0]) if self.args else ""

    def render(self, phrase: OptionPhrase = cli_phrase) -> str:
        """The message with every option reference phrased by ``phrase``."""
        return render_message(self.raw, phrase)

    def __str__(self) -> str:
        return self.render(cli_phrase)


class SpecError(EngineError):
    """A model config that cannot be read or is not supported."""


class OptionsError(EngineError):
    """Export options that do not make sense for this model or execution provider."""


class WeightsError(EngineError):
    """Checkpoint tensors that are missing, unexpected, mis-shaped or unreadable."""


class PackageError(EngineError):
    """An output folder that cannot be written, or a folder that is not a package."""


class RuntimeUnavailableError(EngineError):
    """A runtime or execution provider that is not installed or not usable here."""


class CancelledError(EngineError):
    """The user cancelled a long operation; nothing was left behind."""

    def __init__(self, message: str = "cancelled by the user") -> None:
        super().__init__(message)
