"""The checkpoint's tokenizer files, checked before an export spends any time on weights.

onnxruntime-genai reads a package's ``tokenizer.json`` (and ``tokenizer_config.json``) only
when it loads the package, so a truncated file would be packaged, benchmarked by token ids
and verified, and fail in front of the user. Every tokenizer file the package would carry
is read here instead: the JSON ones must parse as objects (genai refuses any other JSON),
``tokenizer.json`` must load in the ``tokenizers`` library (what transformers tokenizes
with) and fit the model's vocabulary, and ``tokenizer_config.json`` must be beside it
(genai 0.18 fails to load the tokenizer without it).
A checkpoint without ``tokenizer.json`` still exports, with a note that says what the
package lacks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import SpecError
from engine.package import TOKENIZER_FILES

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
JSON_FILES = tuple(name for name in TOKENIZER_FILES if name.endswith(".json"))
TEXT_FILES = tuple(name for name in TOKENIZER_FILES if name.endswith(".jinja"))
"""The files the package copies that are text; ``tokenizer.model`` (a sentencepiece
protobuf) is copied unchecked: genai reads ``tokenizer.json``."""

NO_TOKENIZER_NOTE = (
    "the checkpoint has no tokenizer.json, so neither has the package: onnxruntime-genai will "
    "not be able to run the package's text until tokenizer.json is added (copy tokenizer.json "
    "and tokenizer_config.json from the original checkpoint into the package folder)"
)


def check_tokenizer_files(model_dir: Path, vocab_size: int) -> tuple[str, ...]:
    """Refuse tokenizer files the package could not use; the notes to show otherwise.

    Args:
        model_dir: The checkpoint folder whose tokenizer files the package will copy.
        vocab_size: The model's vocabulary (token ids at or past it have no embedding).

    Raises:
        SpecError: Naming the broken file and what to do about it.
    """
    notes: tuple[str, ...] = ()
    for name in JSON_FILES:
        path = model_dir / name
        if path.is_file():
            text, data = _read_json(path)
            if name == TOKENIZER_JSON:
                notes = _check_tokenizer(path, text, data, vocab_size)
    for name in TEXT_FILES:
        path = model_dir / name
        if path.is_file():
            try:
                path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise _broken(path, f"cannot be read as UTF-8 text ({exc})") from exc
    if not (model_dir / TOKENIZER_JSON).is_file():
        return (NO_TOKENIZER_NOTE,)
    if not (model_dir / TOKENIZER_CONFIG).is_file():
        raise SpecError(
            f"'{model_dir}' has {TOKENIZER_JSON} but no {TOKENIZER_CONFIG}, which "
            f"onnxruntime-genai needs beside it to load the tokenizer. Copy "
            f"{TOKENIZER_CONFIG} from the original checkpoint into '{model_dir}', or remove "
            f"{TOKENIZER_JSON} to build without a tokenizer"
        )
    return notes


def _broken(path: Path, problem: str) -> SpecError:
    return SpecError(
        f"{path} {problem}: the package would carry a tokenizer onnxruntime-genai cannot "
        f"load. Copy a good {path.name} from the original checkpoint (or the model's "
        f"Hugging Face page) into '{path.parent}', or remove it to build without it"
    )


def _read_json(path: Path) -> tuple[str, dict[str, Any]]:
    """The file's text and its JSON object."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(
            f"cannot read {path}: {exc.strerror or exc}; check that the file is readable"
        ) from exc
    except UnicodeDecodeError as exc:
        raise _broken(path, f"is not UTF-8 text ({exc})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        ends_early = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated")
        hint = ", where the file ends early (truncated?)" if ends_early else ""
        raise _broken(
            path, f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}{hint})"
        ) from exc
    except RecursionError as exc:
        raise _broken(path, "is not valid JSON: nested too deeply") from exc
    if not isinstance(data, dict):
        raise _broken(path, f"holds a JSON {type(data).__name__}, not an object")
    return text, data


def _check_tokenizer(
    path: Path, text: str, data: dict[str, Any], vocab_size: int
) -> tuple[str, ...]:
    """A ``tokenizers`` file: a ``model`` object that the library loads, whose vocabulary
    has an embedding row for every id; added tokens past the rows are only a note (a model
    may keep special tokens it never embeds)."""
    if not isinstance(data.get("model"), dict):
        raise _broken(path, "has no 'model' object, so it is not a Hugging Face tokenizers file")
    from tokenizers import Tokenizer  # imported here: `import engine` stays fast

    try:
        # What JSON alone does not show: unknown model types, malformed merges, ...
        Tokenizer.from_str(text)
    except Exception as exc:  # the library raises a bare Exception for any malformed part
        raise _broken(path, f"does not load in the tokenizers library ({exc})") from exc
    model_ids, added_ids = _largest_ids(data)
    if model_ids >= vocab_size:
        raise SpecError(
            f"{path} has a vocabulary of ids up to {model_ids:,}, but config.json's vocab_size "
            f"is {vocab_size:,} (ids from {vocab_size:,} on have no embedding): the tokenizer "
            f"belongs to another model. Copy {path.name} from the checkpoint these weights "
            "come from"
        )
    if added_ids >= vocab_size:
        return (
            f"{path.name} has added tokens with ids up to {added_ids:,}, past config.json's "
            f"vocab_size ({vocab_size:,}): text containing them will fail in onnxruntime-genai "
            "(check that the tokenizer belongs to these weights)",
        )
    return ()


def _largest_ids(data: dict[str, Any]) -> tuple[int, int]:
    """The largest token id of a tokenizers file's model vocabulary (a name -> id map, or
    Unigram's list of [piece, score] by id), and of its added tokens (-1 for none). Read
    from the JSON, which is faster than asking the library for its vocabulary."""
    vocab = data["model"].get("vocab")
    model_ids = [-1]
    if isinstance(vocab, dict):
        model_ids += [v for v in vocab.values() if isinstance(v, int)]
    elif isinstance(vocab, list):
        model_ids.append(len(vocab) - 1)
    added = data.get("added_tokens")
    added_ids = [-1]
    if isinstance(added, list):
        added_ids += [
            t["id"] for t in added if isinstance(t, dict) and isinstance(t.get("id"), int)
        ]
    return max(model_ids), max(added_ids)
