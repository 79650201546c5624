"""CLI subcommands, one module each. A module exposes ``register(subparsers)``, which adds
its parser and sets ``handler`` (a function of the parsed args returning an exit code)."""

COMMAND_MODULES = (
    "engine.commands.build",
    "engine.commands.info",
    "engine.commands.plan",
    "engine.commands.audit",
    "engine.commands.bench",
    "engine.commands.verify",
)
