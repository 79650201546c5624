"""What a run may ask for: lengths that fit the package and numbers in sane ranges.

``bench`` and ``verify`` (and the app) check every length and count here, before any
model is loaded, so a number that cannot work is refused in one line that says which
option to change, instead of failing after minutes of work or exhausting the machine.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from engine.errors import OptionsError, option

if TYPE_CHECKING:
    from engine.runtime.package import Package

DEFAULT_PROMPT_LENGTH = 128
DEFAULT_NEW_TOKENS = 64

MAX_TOKENS = 1 << 20
"""Longest prompt + generation for a package that does not state its own limit: four
times Gemma 4's longest context (256K). A KV cache that long is tens of GB already, so a
longer request is a typo, not a benchmark."""

MAX_REPEATS = 1000
"""Timed runs (and warm-up runs): a median is settled long before, and more would run
for hours; a bigger number is a typo."""

THREADS_PER_CORE = 4
"""intra-op threads allowed per CPU core. onnxruntime starts one OS thread (with its own
stack and scratch memory) per intra-op thread before it runs anything, and does not
return to Python until all have started: 100,000 threads grew to 16 GB and could not be
interrupted for minutes. More threads than cores only contend for them; a few times the
cores still lets a benchmark measure oversubscription on purpose."""


def max_threads() -> int:
    """The most intra-op threads a run may ask for on this machine."""
    return THREADS_PER_CORE * (os.cpu_count() or 1)


def check_range(name: str, value: int, least: int, most: int, why: str = "") -> None:
    """Refuse ``value`` of the option ``name`` (its option markup, so the words
    follow the face: ``--threads`` or the studio's label) outside ``least..most``.

    Raises:
        OptionsError: The value is out of range; the message names the option and range.
    """
    if least <= value <= most:
        return
    raise OptionsError(
        f"{name} must be between {least:,} and {most:,}, got {value:,}"
        + (f" ({why})" if why else "")
    )


def check_threads(threads: int | None) -> None:
    """``threads`` is None (the runtime's default) or 1 .. :func:`max_threads`."""
    if threads is not None:
        cores = os.cpu_count() or 1
        check_range(
            option("threads"),
            threads,
            1,
            max_threads(),
            f"{THREADS_PER_CORE} per CPU core of the {cores} here; more only contend for them",
        )


def check_seed(seed: int) -> None:
    """A random prompt's seed is 0 or more (numpy refuses negative seeds)."""
    if seed < 0:
        raise OptionsError(f"{option('seed')} must be 0 or more, got {seed}")


def sequence_limit(package: Package) -> int:
    """The longest prompt + generation the package can run (0 when it does not say):
    its RoPE caches (context_length) and its preallocated KV buffer (search.max_length)."""
    limits = [n for n in (package.context_length, package.max_length) if n > 0]
    return min(limits) if limits else 0


def check_lengths(
    package: Package,
    prompt: int,
    new: int,
    *,
    prompt_option: str = option("prompt_len"),
    new_option: str = option("new_tokens"),
    least_new: int = 1,
) -> None:
    """A prompt of ``prompt`` tokens followed by ``new`` generated ones fits ``package``.

    ``prompt_option`` / ``new_option`` are the options that set the two lengths, as option
    markup (bench's ``prompt_len`` / ``new_tokens``, verify's ``prompt_len``
    / ``steps``).

    Raises:
        OptionsError: A length below 1 (``least_new`` for ``new``), or a total longer than
            the package supports (or than :data:`MAX_TOKENS` when it does not say).
    """
    limit = sequence_limit(package)
    most = limit or MAX_TOKENS
    for name, value, least in ((prompt_option, prompt, 1), (new_option, new, least_new)):
        if value < least:  # too long is worded below, with the total and an example
            check_range(name, value, least, most)
    if prompt + new <= most:
        return
    total = f"a prompt of {prompt:,} plus {new:,} generated tokens is {prompt + new:,} tokens"
    if not limit:
        raise OptionsError(
            f"{total}, more than the {MAX_TOKENS:,} a run may take; choose a shorter "
            f"{prompt_option} / {new_option}"
        )
    new_example = max(least_new, min(new, limit // 3))
    trained = ((package.manifest or {}).get("model") or {}).get("max_position_embeddings")
    rebuild = (
        f" (the model was trained for no more than {trained:,} tokens: a "
        f"rebuild cannot lengthen it)"
        if isinstance(trained, int) and 0 < trained <= limit
        else f", or rebuild it with a longer {option('max_length')}"
    )
    raise OptionsError(
        f"{total}, more than the {limit:,} this package supports; choose a shorter "
        f"{prompt_option} / "
        f"{new_option} (for example {max(1, limit - new_example)} + {new_example}){rebuild}"
    )


def fit_lengths(
    package: Package, prompt_length: int | None = None, new_tokens: int | None = None
) -> tuple[int, int]:
    """Prompt and generated lengths for a benchmark of ``package``.

    Lengths left ``None`` take the defaults (128 + 64), shrunk to fit the package; given
    ones are kept, and refused up front, with the numbers, when they do not fit.

    Raises:
        OptionsError: The lengths do not fit the package.
    """
    limit = sequence_limit(package)
    if limit and limit < 3:
        raise OptionsError(
            f"'{package.path}' supports sequences of {limit} token(s) only; a benchmark needs "
            "at least 3 (a prompt token and 2 new ones). Rebuild it with a longer "
            f"{option('max_length')}"
        )
    new = new_tokens
    prompt = prompt_length
    if limit:
        if new is None:
            room = limit - (prompt if prompt is not None and prompt > 0 else 1)
            new = max(2, min(DEFAULT_NEW_TOKENS, room, limit // 3))
        if prompt is None:
            prompt = max(1, min(DEFAULT_PROMPT_LENGTH, limit - new))
    prompt = DEFAULT_PROMPT_LENGTH if prompt is None else prompt
    new = DEFAULT_NEW_TOKENS if new is None else new
    check_lengths(package, prompt, new, least_new=2)
    return prompt, new
