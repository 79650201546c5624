"""The command line equivalent to an export set up elsewhere (the app's "Copy CLI command").

The flags are read from the CLI's own parser, not spelled a second time: each option that
differs from what the parser gives when the flag is left out becomes that flag, so the
line stays true as the CLI changes. Options the CLI has no flag for are listed instead of
being dropped silently.
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from engine.options import ExportOptions, unused_quantization
from engine.units import exact_size

PROGRAM = ("python", "-m", "engine")
_NOT_OPTIONS = {"random_weights", "seed"}
"""ExportOptions fields that ``build`` reads from its own flags (handled separately)."""


@dataclass(frozen=True)
class CliLine:
    """A ``python -m engine build`` line for one export."""

    argv: tuple[str, ...]
    """The arguments after ``python -m engine``."""
    missing: tuple[str, ...] = ()
    """Options the CLI has no flag for (``name=value``): the line does not carry them."""

    @property
    def text(self) -> str:
        """The whole command, quoted for a POSIX shell."""
        return shlex.join([*PROGRAM, *self.argv])


def build_line(
    output: str | os.PathLike[str],
    *,
    options: ExportOptions,
    preset: str | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
) -> CliLine:
    """The ``build`` command that exports what these arguments describe."""
    if (preset is None) == (model_dir is None):
        raise ValueError("give either a preset or a model folder")
    model = ["--preset", preset] if preset is not None else ["--model", str(model_dir)]
    parser = _build_parser()
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    baseline = _options(parser, [*model, "OUT"])
    argv = ["build", *model]
    missing = []
    # What shapes quantized weights says nothing of an export without them: the CLI refuses
    # it there (a studio keeps the block size a user chose before picking float weights).
    unused = unused_quantization(options)
    for f in fields(ExportOptions):
        value = getattr(options, f.name)
        if f.name in _NOT_OPTIONS or f.name in unused or value == getattr(baseline, f.name):
            continue
        action = actions.get(f.name)
        if action is None:
            missing.append(f"{f.name}={value}")
            continue
        argv += _flag(action, value)
    if options.random_weights:
        argv.append("--random-weights")
        if options.seed:
            argv += ["--seed", str(options.seed)]
    if overwrite:
        argv.append("--overwrite")
    argv.append(str(Path(output)))
    return CliLine(tuple(argv), tuple(missing))


def parse_build_line(argv: list[str] | tuple[str, ...]) -> tuple[argparse.Namespace, ExportOptions]:
    """What the CLI makes of a ``build`` line: its arguments and its export options."""
    from engine.commands._args import options_from_args

    args = _build_parser().parse_args(list(argv))
    return args, options_from_args(args, random_weights=args.random_weights)


def _build_parser() -> argparse.ArgumentParser:
    from engine.cli import build_parser

    top = build_parser()
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            parser: argparse.ArgumentParser = action.choices["build"]
            return parser
    raise RuntimeError("the CLI has no build command")


def _options(parser: argparse.ArgumentParser, argv: list[str]) -> ExportOptions:
    from engine.commands._args import options_from_args

    return options_from_args(parser.parse_args(argv))


def _flag(action: argparse.Action, value: Any) -> list[str]:
    flag = max(action.option_strings, key=len)  # the long spelling
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return [flag]
    if value is None:
        return [flag, "none"]
    if isinstance(action, argparse._AppendAction):  # repeatable: once per value
        return [part for item in value for part in (flag, str(item))]
    if isinstance(value, (tuple, list)):
        return [flag, ",".join(map(str, value))]
    if action.type is not None and getattr(action.type, "__name__", "") == "size":
        return [flag, exact_size(int(value))]
    return [flag, str(value)]
