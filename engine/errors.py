"""The engine's exception hierarchy.

Every error the engine raises on purpose is an :class:`EngineError`; its message says
what went wrong and what the user can do about it. The CLI prints it without a traceback
and the app shows it in its error panel.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class for every error the engine raises on purpose."""


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
