"""A package folder opened for running: its genai_config read and its files checked.

Opening fails early with a :class:`PackageError` that says what is wrong with the folder
(not a package, unreadable genai_config, a session file or external-data file missing or
truncated: :mod:`engine.runtime.session_files`) instead of an onnxruntime error deep
inside session creation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.caps import get_caps, list_eps
from engine.errors import PackageError, option
from engine.runtime.session_files import check_session_files

GENAI_CONFIG = "genai_config.json"
MANIFEST = "export_studio.json"
_BUILD_HINT = "build one with `python -m engine build ... OUT` and pass OUT"


@dataclass(frozen=True)
class IoNames:
    """Session input / output names; the KV names are ``%d`` templates."""

    input_ids: str = "input_ids"
    attention_mask: str = "attention_mask"
    past_key: str = "past_key_values.%d.key"
    past_value: str = "past_key_values.%d.value"
    logits: str = "logits"
    present_key: str = "present.%d.key"
    present_value: str = "present.%d.value"

    def present_for(self, past: str) -> str:
        """The present output that continues the cache of the past input ``past``."""
        for past_t, present_t in (
            (self.past_key, self.present_key),
            (self.past_value, self.present_value),
        ):
            head, _, tail = past_t.partition("%d")
            if past.startswith(head) and past.endswith(tail):
                index = past[len(head) : len(past) - len(tail)]
                return present_t.replace("%d", index)
        raise KeyError(past)

    def is_past(self, name: str) -> bool:
        return any(_matches(t, name) for t in (self.past_key, self.past_value))


def _matches(template: str, name: str) -> bool:
    head, _, tail = template.partition("%d")
    middle = name[len(head) : len(name) - len(tail)] if len(name) > len(head) + len(tail) else ""
    return name.startswith(head) and name.endswith(tail) and middle.isdigit()


@dataclass(frozen=True)
class Package:
    """A validated package folder (decoder-only LLM)."""

    path: Path
    decoder_file: Path
    model_type: str
    vocab_size: int
    context_length: int
    max_length: int
    """search.max_length: the preallocated KV length in shared-buffer mode."""
    share_buffer: bool
    """search.past_present_share_buffer: past and present KV share one buffer."""
    ep: str
    """The EP the package was built for (short name: cpu, webgpu, ...)."""
    io: IoNames
    eos_token_ids: tuple[int, ...] = ()
    graph_capture: bool = False
    """Whether genai_config switches graph capture on for the decoder."""
    config: Mapping[str, Any] = field(default_factory=dict, repr=False)
    manifest: Mapping[str, Any] | None = field(default=None, repr=False)

    @property
    def multimodal(self) -> bool:
        """A ``gemma4`` package: an embedding session feeds the decoder embeddings."""
        model = self.config.get("model") or {}
        return isinstance(model.get("embedding"), Mapping)

    @property
    def media(self) -> tuple[str, ...]:
        """What prompts may carry besides text: ``image`` and / or ``audio``."""
        model = self.config.get("model") or {}
        kinds = (("image", "vision"), ("audio", "speech"))
        return tuple(
            kind
            for kind, section in kinds
            if isinstance(model.get(section), Mapping) and model[section].get("filename")
        )

    @property
    def dtype(self) -> str | None:
        """Activation dtype from the manifest (fp32, fp16, bf16), when known."""
        options = (self.manifest or {}).get("options") or {}
        value = options.get("dtype")
        return value if isinstance(value, str) and value else None

    @property
    def static_kv(self) -> bool:
        """Some layer writes its K / V into the shared buffers by position (ScatterElements):
        the past inputs hold ``max_length`` slots from the first step and the cache cannot
        grow by Concat. Every layer of a package for an EP with
        ``explicit_attention_over_cache``; the kinds the manifest lists in
        ``static_kv_kinds`` (CUDA's layers wider than GroupQueryAttention serves)."""
        from engine.caps import get_caps

        if not self.share_buffer:
            return False
        kinds = (self.manifest or {}).get("static_kv_kinds")
        return get_caps(self.ep).explicit_attention_over_cache or bool(kinds)

    def capture_problem(self, ep: str | None = None) -> str | None:
        """Why this package cannot run under graph capture on ``ep`` (None: its own EP), or
        None (:func:`capture_problem`)."""
        return capture_problem(self.ep, self.share_buffer, ep)

    def capture_obstacle(self, ep: str | None = None) -> CaptureObstacle | None:
        """:func:`capture_obstacle` for this package on ``ep`` (None: its own EP)."""
        return capture_obstacle(self.ep, self.share_buffer, ep)

    @property
    def quantized(self) -> bool:
        options = (self.manifest or {}).get("options") or {}
        return bool(options.get("weight_bits") or options.get("embedding_bits"))


@dataclass(frozen=True)
class CaptureObstacle:
    """Why a package cannot run under graph capture on an EP, and the export that would
    let it, when one would."""

    why: str
    rebuild: str | None = None
    """What to export instead (option markup), or None when no export of this package's
    kind would capture there."""

    def __str__(self) -> str:
        return f"{self.why}: {self.rebuild}" if self.rebuild else self.why


def capture_obstacle(
    built_for: str, share_buffer: bool, ep: str | None = None
) -> CaptureObstacle | None:
    """Why a package built for EP ``built_for`` cannot run under graph capture on ``ep``
    (None: ``built_for``), or None. Capture replays a graph built for it: the EP must
    capture (from Python), the KV must be one shared buffer, and the package must have been
    built for that EP (a CPU package's graph on WebGPU has host nodes and int64 inputs:
    captured, it gives other tokens than without capture)."""
    caps = get_caps(ep or built_for)
    if not caps.graph_capture:
        return CaptureObstacle(f"{caps.display_name} has no graph capture")
    if not share_buffer:
        return CaptureObstacle(
            "the package does not share past/present KV (capture needs one buffer)"
        )
    if not caps.capture_option:
        return CaptureObstacle(f"graph capture on {caps.display_name} is not available from Python")
    if caps.name != built_for:
        return CaptureObstacle(
            f"the package was built for {get_caps(built_for).display_name}, not for capture "
            f"on {caps.display_name}",
            f"export it with {option('ep', caps.name)}",
        )
    return None


def capture_problem(built_for: str, share_buffer: bool, ep: str | None = None) -> str | None:
    """:func:`capture_obstacle` as one sentence, or None."""
    obstacle = capture_obstacle(built_for, share_buffer, ep)
    return None if obstacle is None else str(obstacle)


def open_package(path: str | os.PathLike[str]) -> Package:
    """Open a package folder and check that every file it names is there.

    Every genai_config and manifest field the runners read is checked for its type here, so a
    hand-edited file fails with one message naming the field.

    Raises:
        PackageError: The folder is missing, is not a package, names missing files, or holds
            a genai_config / manifest field of the wrong type.
    """
    folder = Path(path).expanduser()
    if not folder.exists():
        raise PackageError(f"'{folder}' does not exist; {_BUILD_HINT}")
    if not folder.is_dir():
        raise PackageError(f"'{folder}' is a file, not a package folder; {_BUILD_HINT}")
    config = _read_json(folder / GENAI_CONFIG, required=True) or {}
    manifest = _read_json(folder / MANIFEST, required=False)
    where = f"{folder / GENAI_CONFIG}"
    model = _section(config, "model", folder)
    decoder = _section(model, "decoder", folder, prefix="model.")
    filename = decoder.get("filename")
    if not isinstance(filename, str) or not filename:
        raise PackageError(
            f"{where}: model.decoder.filename is missing; the file must name the decoder's "
            ".onnx file"
        )
    _check_config_types(config, where)
    if manifest is not None and not isinstance(manifest.get("options", {}), dict):
        raise PackageError(f"{folder / MANIFEST}: 'options' must be an object")
    check_session_files(folder, model, folder / GENAI_CONFIG)
    search = config.get("search") or {}
    context = _count(model, "context_length", where) or _count(search, "max_length", where)
    inputs = decoder.get("inputs") or {}
    outputs = decoder.get("outputs") or {}
    defaults = IoNames()
    io = IoNames(
        input_ids=inputs.get("input_ids", defaults.input_ids),
        attention_mask=inputs.get("attention_mask", defaults.attention_mask),
        past_key=inputs.get("past_key_names", defaults.past_key),
        past_value=inputs.get("past_value_names", defaults.past_value),
        logits=outputs.get("logits", defaults.logits),
        present_key=outputs.get("present_key_names", defaults.present_key),
        present_value=outputs.get("present_value_names", defaults.present_value),
    )
    for label, template in (
        ("inputs.past_key_names", io.past_key),
        ("inputs.past_value_names", io.past_value),
        ("outputs.present_key_names", io.present_key),
        ("outputs.present_value_names", io.present_value),
    ):
        if template.count("%d") != 1 or "%" in template.replace("%d", ""):
            raise PackageError(
                f"{where}: model.decoder.{label} must hold one '%d' for the layer number, "
                f"got '{template}'"
            )
    eos = model.get("eos_token_id")
    eos_ids = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return Package(
        path=folder.absolute(),
        decoder_file=(folder / filename).absolute(),
        model_type=str(model.get("type", "")),
        vocab_size=_count(model, "vocab_size", where),
        context_length=context,
        max_length=_count(search, "max_length", where) or context,
        share_buffer=bool(search.get("past_present_share_buffer", False)),
        ep=_package_ep(decoder, manifest),
        io=io,
        eos_token_ids=eos_ids,
        graph_capture=_capture_in_config(decoder),
        config=config,
        manifest=manifest,
    )


def _count(section: Mapping[str, Any], key: str, where: str) -> int:
    value = section.get(key)
    return 0 if value is None else int(value)


def _check_config_types(config: Mapping[str, Any], where: str) -> None:
    """The types of every genai_config field the runners read (values are checked where
    they are used)."""

    def fail(field: str, want: str, value: Any) -> PackageError:
        return PackageError(
            f"{where}: '{field}' must be {want}, got {value!r}; fix the file or rebuild the package"
        )

    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    model, search = config["model"], config.get("search")
    if search is not None and not isinstance(search, dict):
        raise fail("search", "an object", search)
    for section, prefix in ((model, "model."), (search or {}, "search.")):
        for key in ("context_length", "vocab_size", "max_length"):
            if section.get(key) is not None and not whole(section[key]):
                raise fail(prefix + key, "a whole number", section[key])
    share = (search or {}).get("past_present_share_buffer")
    if share is not None and not isinstance(share, bool):
        raise fail("search.past_present_share_buffer", "true or false", share)
    eos = model.get("eos_token_id")
    if eos is not None and not (whole(eos) or (isinstance(eos, list) and all(map(whole, eos)))):
        raise fail("model.eos_token_id", "a token id or a list of them", eos)
    if model.get("type") is not None and not isinstance(model["type"], str):
        raise fail("model.type", "a name", model["type"])
    for name, section in model.items():
        if not isinstance(section, dict) or "filename" not in section:
            continue
        label = f"model.{name}"
        filename = section["filename"]
        if not isinstance(filename, str) or not filename:
            raise fail(f"{label}.filename", "a file name", filename)
        if Path(filename).is_absolute() or ".." in Path(filename).parts:
            raise PackageError(
                f"{where}: {label}.filename '{filename}' is outside the package folder; "
                "session files must be inside it"
            )
        for key in ("inputs", "outputs"):
            names = section.get(key)
            if names is None:
                continue
            if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
                raise fail(f"{label}.{key}", "an object of names", names)
        options = section.get("session_options")
        if options is None:
            continue
        if not isinstance(options, dict):
            raise fail(f"{label}.session_options", "an object", options)
        providers = options.get("provider_options")
        if providers is None:
            continue
        if not isinstance(providers, list):
            raise fail(f"{label}.session_options.provider_options", "a list", providers)
        for entry in providers:
            if not isinstance(entry, dict) or not all(
                isinstance(v, dict) and all(isinstance(x, (str, int, float)) for x in v.values())
                for v in entry.values()
            ):
                raise fail(
                    f"{label}.session_options.provider_options",
                    'a list of {"provider": {"option": "value"}} objects',
                    entry,
                )


def _read_json(path: Path, *, required: bool) -> dict[str, Any] | None:
    if not path.is_file():
        if required:
            raise PackageError(
                f"'{path.parent}' is not a package: it has no {path.name}; {_BUILD_HINT}"
            )
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise PackageError(f"cannot read {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise PackageError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "fix the file or rebuild the package"
        ) from exc
    if not isinstance(data, dict):
        raise PackageError(f"{path} must hold a JSON object, not {type(data).__name__}")
    return data


def _section(
    data: Mapping[str, Any], key: str, folder: Path, prefix: str = ""
) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise PackageError(
            f"{folder / GENAI_CONFIG}: the '{prefix}{key}' section is missing; "
            "this is not a decoder package genai can run"
        )
    return value


def _package_ep(decoder: Mapping[str, Any], manifest: Mapping[str, Any] | None) -> str:
    options = (manifest or {}).get("options") or {}
    if isinstance(options.get("ep"), str) and options["ep"] in list_eps():
        return str(options["ep"])
    for entry in (decoder.get("session_options") or {}).get("provider_options") or []:
        for key in entry:
            for ep in list_eps():
                if get_caps(ep).genai_provider == key:
                    return ep
    return "cpu"


def session_provider_options(decoder: Mapping[str, Any], provider: str | None) -> dict[str, str]:
    """The decoder's ``provider_options`` for one genai provider key, values as strings."""
    for entry in (decoder.get("session_options") or {}).get("provider_options") or []:
        if isinstance(entry, Mapping) and provider in entry:
            return {str(k): str(v) for k, v in entry[provider].items()}
    return {}


def _capture_in_config(decoder: Mapping[str, Any]) -> bool:
    """Graph capture is on for the decoder: its EP's capture option (from the EP
    capabilities) is "1", as onnxruntime-genai reads it."""
    for ep in list_eps():
        caps = get_caps(ep)
        if caps.capture_option is None or caps.genai_provider is None:
            continue
        options = session_provider_options(decoder, caps.genai_provider)
        if options.get(caps.capture_option) == "1":
            return True
    return False
