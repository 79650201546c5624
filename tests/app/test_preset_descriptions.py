"""What the studio shows of a preset: where its architecture comes from, nothing internal."""

from __future__ import annotations

import re

import pytest

from app.widgets.model_panel import preset_choices

PATH = re.compile(
    r"(?:^|[\s(\"'])(?:/|~/|\./|\.\./|[A-Za-z]:\\)"  # an absolute, home or relative path
    r"|\w+/[\w.-]+/"  # two slashes: a path, not an owner/name repository id
    r"|\.(?:py|md|json|txt|ya?ml|ipynb)\b"  # a file name
)
REPOSITORY = re.compile(r"\b(?:google|Qwen|meta-llama|mistralai|HuggingFaceTB|microsoft)/[\w.-]+")
INTERNAL = (
    "validator",
    "pinning",
    "revision",
    "development",
    "notes",
    "todo",
    "fixme",
    "verify against",
    "cross-check",
    "test copy",
    "reconstructed",
    "commit",
    "_variants",
)


@pytest.mark.parametrize("bad", ["See /work/notes/gemma4_configs.md", "models/gemma4/x", "a.py"])
def test_the_path_pattern_finds_paths(bad: str) -> None:
    assert PATH.search(bad)


def test_the_path_pattern_allows_a_repository_id() -> None:
    assert not PATH.search("Gemma 4 E2B (google/gemma-4-E2B-it): text decoder.")


@pytest.mark.parametrize("name, text", preset_choices())
def test_preset_descriptions_say_where_the_architecture_comes_from_and_nothing_internal(
    name: str, text: str
) -> None:
    assert text.strip(), f"{name} has no description"
    assert not PATH.search(text), f"{name}'s description names a file path: {text}"
    lowered = text.lower()
    leaks = [word for word in INTERNAL if word in lowered]
    assert not leaks, f"{name}'s description has internal remarks ({leaks}): {text}"
    if name != "gemma4-tiny":  # the real models: their public source, by repository id
        assert REPOSITORY.search(text) and "Hugging Face" in text, text
