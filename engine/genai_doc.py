"""genai_config.json as an editable document: typed fields, capture toggles, lint, faithful save.

The app's config editor edits a package's ``genai_config.json`` through :class:`GenaiDoc`.
Every field the editor does not know is kept as it was; known fields are validated and a
refused value comes with the reason. Saving a document nobody changed writes the file's
original bytes back, so "open, save" never produces a diff.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.caps import get_caps, list_eps
from engine.errors import EngineError

JsonPath = tuple[str | int, ...]
"""Keys and list indices from the document root, e.g. ``("search", "max_length")``."""

SESSIONS = ("decoder", "embedding", "vision", "speech")
"""Sessions of a genai package that may carry their own provider options."""

Kind = Literal["int", "float", "bool", "str", "token_ids", "json"]
_KIND_NAMES = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "text",
    "token_ids": "a token id or a list of them",
    "json": "a JSON value",
}


class GenaiConfigError(EngineError):
    """A genai_config.json that cannot be read or written."""


class ConfigValueError(GenaiConfigError):
    """A value refused for a field; ``reason`` says why."""

    def __init__(self, path: JsonPath, reason: str) -> None:
        super().__init__(f"{format_path(path)}: {reason}")
        self.path = path
        self.reason = reason


def format_path(path: JsonPath) -> str:
    """``("model", "decoder", "x", 0)`` -> ``model.decoder.x[0]``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(root)"


@dataclass(frozen=True)
class FieldRule:
    """The type and range of one known field."""

    kind: Kind
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False
    """``minimum`` is exclusive."""
    choices: tuple[str, ...] = ()
    non_empty: bool = False

    def describe(self) -> str:
        """A short description for tooltips, e.g. ``an integer >= 1``."""
        text, low, high = _KIND_NAMES[self.kind], self.minimum, self.maximum
        if low is not None and high is not None and not self.above:
            text += f" from {_num(low)} to {_num(high)}"
        elif low is not None:
            text += f" {'>' if self.above else '>='} {_num(low)}"
        return text + (f" ({' or '.join(self.choices)})" if self.choices else "")

    def check(self, value: Any) -> str | None:
        """The reason ``value`` is refused, or None when it is acceptable."""
        if self.kind == "token_ids" and isinstance(value, list):
            if not value:
                return "needs at least one token id"
            return next((f"every id {r}" for v in value if (r := self._scalar("int", v))), None)
        return self._scalar("int" if self.kind == "token_ids" else self.kind, value)

    def _scalar(self, kind: str, value: Any) -> str | None:
        wrong = f"must be {_KIND_NAMES[kind]}, got {_show(value)}"
        if kind in ("json", "bool"):
            return None if kind == "json" or isinstance(value, bool) else wrong
        if kind == "str":
            if not isinstance(value, str):
                return wrong
            if self.non_empty and not value.strip():
                return "must not be empty"
            if self.choices and value not in self.choices:
                return f"must be one of {', '.join(self.choices)}, got {value!r}"
            return None
        if isinstance(value, bool) or not isinstance(value, int if kind == "int" else (int, float)):
            return wrong
        if not math.isfinite(value):
            return "must be a finite number"
        low, high = self.minimum, self.maximum
        if low is not None and (value <= low if self.above else value < low):
            return f"must be {'>' if self.above else '>='} {_num(low)}, got {value}"
        if high is not None and value > high:
            return f"must be <= {_num(high)}, got {value}"
        return None

    def parse(self, text: str) -> Any:
        """Read what a user typed (JSON literals: 42, 0.5, true, [1, 2]); the range is
        checked on set."""
        if self.kind == "str":
            return text
        raw = text.strip()
        if self.kind == "token_ids" and "," in raw and not raw.startswith("["):
            raw = f"[{raw}]"
        try:
            value = json.loads(raw)
        except ValueError:
            raise ValueError(f"{raw!r} is not {_KIND_NAMES[self.kind]}") from None
        return float(value) if self.kind == "float" and _is_int(value) else value


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _show(value: Any) -> str:
    return type(value).__name__ if isinstance(value, (dict, list)) else json.dumps(value)


_RULE_TABLE: tuple[tuple[FieldRule, str], ...] = (
    (
        FieldRule("int", minimum=1),
        """model.vocab_size model.context_length model.*.head_size model.*.hidden_size
        model.*.num_attention_heads model.*.num_hidden_layers model.*.num_key_value_heads
        model.decoder.sliding_window.window_size search.max_length search.num_beams
        search.num_return_sequences search.batch_size search.chunk_size""",
    ),
    (
        FieldRule("int", minimum=0),
        "model.bos_token_id model.pad_token_id search.min_length search.top_k "
        "search.no_repeat_ngram_size",
    ),
    (FieldRule("int"), "model.decoder.sliding_window.pad_value"),
    (FieldRule("int", minimum=-1), "search.random_seed"),
    (FieldRule("token_ids", minimum=0), "model.eos_token_id"),
    (FieldRule("str", non_empty=True), "model.type model.*.filename"),
    # onnxruntime-genai hands provider options to onnxruntime as strings.
    (
        FieldRule("str"),
        "model.*.session_options.log_id model.*.session_options.provider_options.#.*.*",
    ),
    (FieldRule("str", choices=("left", "right")), "model.decoder.sliding_window.alignment"),
    (
        FieldRule("bool"),
        "model.decoder.sliding_window.slide_inputs search.do_sample search.early_stopping "
        "model.decoder.sliding_window.slide_key_value_cache search.past_present_share_buffer",
    ),
    (FieldRule("float", minimum=0.0, maximum=1.0), "search.top_p"),
    (FieldRule("float", minimum=0.0, above=True), "search.temperature search.repetition_penalty"),
    (FieldRule("float", minimum=0.0), "search.diversity_penalty"),
    (FieldRule("float"), "search.length_penalty"),
)
_RULES = {tuple(path.split(".")): rule for rule, paths in _RULE_TABLE for path in paths.split()}
"""Known fields by dotted path: ``*`` matches any key (a session), ``#`` any list index."""
_SHARE: JsonPath = ("search", "past_present_share_buffer")
_SLIDE: JsonPath = ("model", "decoder", "sliding_window", "slide_inputs")


def rule_for(path: JsonPath) -> FieldRule | None:
    """The rule of a known field (``*`` matches any key, ``#`` any list index)."""
    for pattern, rule in _RULES.items():
        if len(pattern) == len(path) and all(
            isinstance(part, int) if p == "#" else isinstance(part, str) and p in ("*", part)
            for p, part in zip(pattern, path, strict=True)
        ):
            return rule
    return None


CAPTURE_OPTIONS: dict[str, str] = {
    caps.genai_provider: caps.capture_option
    for caps in map(get_caps, list_eps())
    if caps.genai_provider and caps.capture_option
}
"""genai provider name -> the provider option that switches graph capture on ("1"/"0")."""


@dataclass(frozen=True)
class Lint:
    """A known trap (or a broken rule) found in the document."""

    code: str
    message: str
    path: JsonPath = ()


class GenaiDoc:
    """An open genai_config.json: the parsed data plus what is needed to save it faithfully."""

    def __init__(self, raw: bytes, path: Path | None = None) -> None:
        self.path = path
        self._raw = raw
        try:
            self._text = raw.decode("utf-8")
            data = json.loads(self._text.removeprefix("\ufeff"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise GenaiConfigError(f"{path or 'the file'}: not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise GenaiConfigError("genai_config.json must hold a JSON object at the top level")
        self.data: dict[str, Any] = data
        self._saved = json.dumps(data)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> GenaiDoc:
        """Open a file (a package folder means its genai_config.json)."""
        file = Path(path)
        if file.is_dir():
            file = file / "genai_config.json"
        try:
            return cls(file.read_bytes(), file)
        except OSError as exc:
            raise GenaiConfigError(f"cannot read {file}: {exc.strerror or exc}") from exc

    @property
    def modified(self) -> bool:
        """True when the data differs from what was loaded or last saved."""
        # json.dumps tells true from 1 and 1 from 1.0, which == does not.
        return json.dumps(self.data) != self._saved

    def get(self, path: JsonPath, default: Any = None) -> Any:
        """The value at ``path``, or ``default`` when it is not there."""
        node: Any = self.data
        for part in path:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return default
        return node

    def check(self, path: JsonPath, value: Any) -> str | None:
        """Why ``value`` would be refused at ``path``, or None."""
        rule = rule_for(path)
        if rule is not None:
            return rule.check(value)
        current = self.get(path)
        if isinstance(current, (dict, list)) and not isinstance(value, type(current)):
            return f"must stay {'a list' if isinstance(current, list) else 'a JSON object'}"
        return None

    def set(self, path: JsonPath, value: Any) -> None:
        """Set one existing field; raises :class:`ConfigValueError` with the reason."""
        reason = self.check(path, value) if path else "the root cannot be replaced"
        if reason:
            raise ConfigValueError(path, reason)
        parent, key = self.get(path[:-1]), path[-1]
        in_object = isinstance(parent, dict) and isinstance(key, str)
        in_list = isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent)
        if not (in_object or in_list):
            raise ConfigValueError(path, f"{format_path(path[:-1])} does not exist")
        parent[key] = value

    def set_text(self, path: JsonPath, text: str) -> Any:
        """Set what the user typed, read with the field's type (known, or the current
        value's); returns the stored value or raises :class:`ConfigValueError`."""
        rule = rule_for(path) or FieldRule("str" if isinstance(self.get(path), str) else "json")
        try:
            value = rule.parse(text)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise ConfigValueError(path, str(exc)) from None
        self.set(path, value)
        return value

    def problems(self) -> list[Lint]:
        """Known fields whose current value breaks their rule (a hand-edited file)."""
        return [
            Lint("invalid-value", f"{format_path(path)} {reason}", path)
            for path, value in _walk(self.data)
            if (rule := rule_for(path)) is not None and (reason := rule.check(value))
        ]

    def sessions(self) -> list[str]:
        """Sessions present under ``model`` (sections that name an .onnx file), in the usual
        order; ``"speech": {"config_filename": ""}`` says a package has no audio session."""
        model = self.data.get("model")
        if not isinstance(model, dict):
            return []
        return [s for s in SESSIONS if isinstance(model.get(s), dict) and model[s].get("filename")]

    def _capture_slot(self, session: str) -> tuple[dict[str, Any], str] | None:
        options = self.get(("model", session, "session_options", "provider_options"))
        for entry in options if isinstance(options, list) else []:
            for provider, values in entry.items() if isinstance(entry, dict) else ():
                if provider in CAPTURE_OPTIONS and isinstance(values, dict):
                    return values, CAPTURE_OPTIONS[provider]
        return None

    def capture(self, session: str) -> bool | None:
        """Whether graph capture is on for a session; None when its provider has no switch."""
        slot = self._capture_slot(session)
        return None if slot is None else slot[0].get(slot[1]) in ("1", "true", "True", 1, True)

    def set_capture(self, session: str, on: bool) -> None:
        """Turn a session's graph capture on or off through its provider's own option."""
        slot = self._capture_slot(session)
        if slot is None:
            raise ConfigValueError(("model", session), "its provider has no graph-capture option")
        slot[0][slot[1]] = "1" if on else "0"

    def lint(self) -> list[Lint]:
        """Known traps: settings that make onnxruntime-genai refuse capture or misbehave."""
        found: list[Lint] = []

        def trap(hit: bool, code: str, message: str, path: JsonPath) -> None:
            if hit:
                found.append(Lint(code, message, path))

        captured = [s for s in self.sessions() if self.capture(s)]
        on = f"graph capture is on ({', '.join(captured)})"
        why = "a captured graph replays fixed buffers, so past and present KV must share one"
        share_off = bool(captured) and self.get(_SHARE) is False
        trap(share_off, "capture-without-share-buffer", f"{on}, share buffer off: {why}", _SHARE)
        why = "sliding the inputs changes shapes between steps, which a captured graph cannot"
        slides = "decoder" in captured and self.get(_SLIDE) is True
        trap(slides, "capture-with-slide-inputs", f"{on}, slide_inputs on: {why}", _SLIDE)
        for key in ("num_beams", "batch_size"):
            value, path = self.get(("search", key)), ("search", key)
            message = f"{on} with search.{key} = {value}: capture runs one sequence (batch 1)"
            hit = bool(captured) and _is_int(value) and value > 1
            trap(hit, f"capture-with-{key.replace('_', '-')}", message, path)
        length, context = self.get(("search", "max_length")), self.get(("model", "context_length"))
        message = f"search.max_length ({length}) exceeds model.context_length ({context})"
        hit = _is_int(length) and _is_int(context) and length > context
        trap(hit, "max-length-over-context", message, ("search", "max_length"))
        vocab = self.get(("model", "vocab_size"))
        for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
            value = self.get(("model", key))
            ids = value if isinstance(value, list) else [value]
            bad = [i for i in ids if _is_int(i) and _is_int(vocab) and i >= vocab]
            message = f"model.{key} {bad} is not below vocab_size ({vocab})"
            if key == "eos_token_id":
                message += ": the model never produces it, so generation never stops on it"
            trap(bool(bad), f"{key.replace('_', '-')}-out-of-vocab", message, ("model", key))
        return found

    def dumps(self) -> bytes:
        """The bytes :meth:`save` writes: the original ones when nothing changed."""
        return _dump_like(self._text, self.data) if self.modified else self._raw

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the document (to its own file by default), atomically; an unchanged
        document is written byte for byte as it was read."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise GenaiConfigError("this document has no file yet; give a path to save it to")
        raw = self.dumps()
        tmp = target.with_name(f".{target.name}.saving")
        try:
            tmp.write_bytes(raw)
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise GenaiConfigError(f"cannot write {target}: {exc.strerror or exc}") from exc
        self._raw, self._text = raw, raw.decode("utf-8")
        self._saved, self.path = json.dumps(self.data), target
        return target


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _walk(node: Any, path: JsonPath = ()) -> Iterator[tuple[JsonPath, Any]]:
    if not isinstance(node, (dict, list)):
        return
    for key, value in node.items() if isinstance(node, dict) else enumerate(node):
        yield (*path, key), value
        yield from _walk(value, (*path, key))


def _dump_like(original: str, data: Any) -> bytes:
    """``data`` as JSON formatted the way ``original`` was: indent, separators, ASCII
    escapes, line endings, final newline and byte-order mark."""
    indent = re.search(r"[\[{]\r?\n([ \t]+)\S", original)
    spaced_keys = re.search(r'"\s*:\s', original) is not None or '":' not in original
    spaced_items = indent is None and re.search(r",\S", original) is None
    text = json.dumps(
        data,
        indent=indent.group(1) if indent else None,
        separators=(", " if spaced_items else ",", ": " if spaced_keys else ":"),
        ensure_ascii=original.removeprefix("\ufeff").isascii(),
    )
    text = text + "\n" * original.endswith("\n")
    if "\r\n" in original:
        text = text.replace("\n", "\r\n")
    return text.encode("utf-8-sig" if original.startswith("\ufeff") else "utf-8")
