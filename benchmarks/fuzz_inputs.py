"""Fuzz the engine's inputs: seeded mutations of safetensors headers and bytes, shard indexes,
config.json fields, export options, genai_config.json and manifest fields, each run through
the CLI (``build``, ``info``, ``plan``, ``bench``, ``audit``) as a user would.

Every case is classified by outcome:

* ``clear error``: the command failed with an ``error: ...`` message (or an argparse usage
  error), no traceback;
* ``ok``: the command succeeded;
* ``traceback``: an exception escaped the CLI, or the process died;
* ``leftover``: the command left something behind (a staging or ``.old`` folder, an empty
  parent folder, a temporary file, a changed input) or, after a success, the package is
  missing;
* ``hang``: the case ran past ``--timeout`` seconds (the worker is killed);
* ``broken package``: ``build`` succeeded, but the package it wrote fails to generate greedy
  tokens on the CPU EP (a package that cannot run should have been refused). CUDA / TensorRT-RTX
  packages (their default is bf16 or fp16 kernels the CPU lacks) and bf16 ones are not run.

The goal is 0 tracebacks, 0 leftovers, 0 hangs and 0 broken packages. Cases are a pure function of
``(seed, index)``: ``--only 17 42`` replays cases. Workers are forked processes that run the
CLI in-process (no interpreter start per case), each under an address-space limit so that a
case that allocates without bound fails instead of taking the machine. Prints one JSON object:

    python benchmarks/fuzz_inputs.py --cases 3000 --seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import itertools
import json
import multiprocessing as mp
import os
import queue
import random
import re
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OUTCOMES = ("clear error", "ok", "traceback", "leftover", "hang", "broken package")
KINDS = ("header", "bytes", "shards", "config", "options", "genai", "manifest")
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
ADDRESS_SPACE = 12 * 2**30
"""Per-worker address-space limit (onnxruntime reserves generously, so not too tight)."""


@dataclass
class Case:
    """One fuzz case: what was mutated and the command that runs on the result."""

    index: int
    kind: str
    mutations: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)


@dataclass
class Result:
    index: int
    kind: str
    outcome: str
    detail: str
    mutations: list[str]
    argv: list[str]
    seconds: float
    warnings: int = 0


# ----------------------------------------------------------------------------- values

INTS = [0, 1, 2, 3, 7, 8, 16, 31, 33, 64, 1023, 2**31 - 1, 2**31, 10**9, 10**12, -1, -64]
ODD_VALUES: list[Any] = [
    1.5,
    64.0,
    -0.0,
    float("nan"),
    float("inf"),
    "",
    "one",
    "64",
    True,
    False,
    None,
    [],
    [1],
    ["sliding_attention"],
    {},
    {"x": 1},
    [[1, 2]],
]


def any_value(rng: random.Random) -> Any:
    return rng.choice(INTS) if rng.random() < 0.5 else copy.deepcopy(rng.choice(ODD_VALUES))


def describe(value: Any) -> str:
    text = json.dumps(value) if _json_safe(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------- base fixtures


@dataclass(frozen=True)
class Base:
    """Unmutated inputs every case starts from (never modified: cases copy or hard-link)."""

    root: Path
    config: dict[str, Any]
    header: dict[str, Any]
    header_bytes: bytes
    data: bytes
    package: Path
    genai: dict[str, Any]
    manifest: dict[str, Any]


def make_base(root: Path) -> Base:
    from engine.options import ExportOptions
    from engine.pipeline import export
    from tests._support.fake_checkpoint import tiny_config, write_checkpoint

    config = tiny_config()
    model = write_checkpoint(root / "base-model", config)
    raw = (model / WEIGHTS).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header_bytes = raw[8 : 8 + length]
    package = root / "base-package"
    export(package, preset="gemma4-tiny", options=ExportOptions(random_weights=True, max_length=64))
    return Base(
        root=root,
        config=config,
        header=json.loads(header_bytes),
        header_bytes=header_bytes,
        data=raw[8 + length :],
        package=package,
        genai=json.loads((package / "genai_config.json").read_text()),
        manifest=json.loads((package / "export_studio.json").read_text()),
    )


def safetensors_bytes(header: Any, data: bytes, raw_header: bytes | None = None) -> bytes:
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


# ---------------------------------------------------------------------------- mutators


def mutate_entry(rng: random.Random, header: dict[str, Any], case: Case) -> None:
    names = [n for n in header if n != "__metadata__"]
    name = rng.choice(names)
    entry = header[name]
    if not isinstance(entry, dict):
        return
    # An earlier mutation of this case may have broken the entry already.
    offsets, shape = entry.get("data_offsets"), entry.get("shape")
    valid = isinstance(offsets, list) and len(offsets) == 2
    begin, end = (int(offsets[0]), int(offsets[1])) if valid else (0, 0)
    shape = list(shape) if isinstance(shape, list) and shape else [1]
    what = rng.choice(["dtype", "shape", "data_offsets"])
    if what == "dtype":
        value: Any = rng.choice(
            ["F16", "BF16", "U8", "I64", "F64", "BOOL", "F8_E4M3", "F17", "", 3, None, ["F32"]]
        )
    elif what == "shape":
        options: list[Any] = [
            [],
            [0],
            [-1],
            shape * 2,
            shape[::-1],
            [shape[0] + 1, *shape[1:]],
            [max(shape[0] - 1, 0), *shape[1:]],
            [2**40],
            "8",
            [1.5],
            None,
            [shape],
            [*shape, 1],
        ]
        value = rng.choice(options)
    else:
        k = rng.choice([1, 2, 4, 8, 64])
        options = [
            [begin, end + k],
            [begin + k, end + k],
            [end, begin],
            [begin, begin],
            [-1, end],
            [begin, 2**62],
            [float(begin), end],
            "x",
            [begin],
            None,
            [True, end],
            [begin - k, end - k],
        ]
        value = rng.choice(options)
    entry[what] = value
    case.mutations.append(f"header[{name!r}].{what} = {describe(value)}")


def mutate_header(rng: random.Random, base: Base, case: Case) -> bytes:
    header = copy.deepcopy(base.header)
    raw_header: bytes | None = None
    data = base.data
    for _ in range(rng.randint(1, 3)):
        choice = rng.random()
        names = [n for n in header if n != "__metadata__"] if isinstance(header, dict) else []
        if choice < 0.5 and names:
            mutate_entry(rng, header, case)
        elif choice < 0.6 and names:
            name = rng.choice(names)
            del header[name]
            case.mutations.append(f"delete header[{name!r}]")
        elif choice < 0.7 and names:
            name = rng.choice(names)
            header[name + ".copy"] = copy.deepcopy(header[name])
            case.mutations.append(f"duplicate header[{name!r}] as {name}.copy")
        elif choice < 0.75 and names:
            name = rng.choice(names)
            header[name.replace("layers.", "layers.9")] = header.pop(name)
            case.mutations.append(f"rename header[{name!r}]")
        elif choice < 0.85:
            value = rng.choice([{"format": "pt"}, {"a": 1}, [], "x", {"a": None}])
            header["__metadata__"] = value
            case.mutations.append(f"__metadata__ = {describe(value)}")
        elif choice < 0.9:
            header = rng.choice([[], "x", 1, None, [header]])
            case.mutations.append(f"header = {describe(header)}")
            break
        else:
            text = json.dumps(header).encode()
            cut = rng.randrange(len(text))
            action = rng.choice(["truncate", "garbage", "dup-key", "not-utf8"])
            if action == "truncate":
                raw_header = text[:cut]
            elif action == "garbage":
                raw_header = text[:cut] + bytes(rng.randrange(256) for _ in range(4)) + text[cut:]
            elif action == "dup-key":
                first = next(iter(names), "a")
                entry = json.dumps({first: header.get(first, {})})[1:-1].encode()
                raw_header = b"{" + entry + b", " + text[1:]
            else:
                raw_header = text[:cut] + b"\xff\xfe" + text[cut:]
            case.mutations.append(f"header JSON {action} at {cut}")
            break
    blob = safetensors_bytes(header, data, raw_header)
    if rng.random() < 0.15:
        (length,) = struct.unpack("<Q", blob[:8])
        new = rng.choice([0, length - 1, length + 1, length + 8, 2**63, len(blob), 7])
        blob = struct.pack("<Q", new) + blob[8:]
        case.mutations.append(f"header length {length} -> {new}")
    return blob


def float_bytes(value: float, fmt: str = "<f") -> bytes:
    return struct.pack(fmt, value)


def mutate_bytes(rng: random.Random, base: Base, case: Case) -> bytes:
    blob = bytearray(safetensors_bytes(base.header, base.data))
    start = 8 + len(safetensors_bytes(base.header, b"")) - 8
    for _ in range(rng.randint(1, 3)):
        action = rng.choice(["truncate", "append", "flip", "poison", "poison", "zero", "header"])
        if action == "truncate":
            cut = rng.randrange(len(blob))
            del blob[cut:]
            case.mutations.append(f"truncate at {cut}")
        elif action == "append":
            count = rng.choice([1, 4, 8, 100])
            blob += bytes(rng.randrange(256) for _ in range(count))
            case.mutations.append(f"append {count} bytes")
        elif action == "flip" and len(blob) > start:
            at = rng.randrange(start, len(blob))
            blob[at] ^= 1 << rng.randrange(8)
            case.mutations.append(f"flip a bit at {at}")
        elif action == "poison" and len(blob) > start + 4:
            name = rng.choice([n for n in base.header if n != "__metadata__"])
            begin, end = base.header[name]["data_offsets"]
            at = start + begin + 4 * rng.randrange(max((end - begin) // 4, 1))
            value = rng.choice([float("nan"), float("inf"), -float("inf"), 7e4, -1e5, 3e38])
            blob[at : at + 4] = float_bytes(value)
            case.mutations.append(f"{name}[{(at - start - begin) // 4}] = {value}")
        elif action == "zero" and len(blob) > start:
            at = rng.randrange(start, len(blob))
            count = rng.choice([4, 64, 4096])
            blob[at : at + count] = bytes(len(blob[at : at + count]))
            case.mutations.append(f"zero {count} bytes at {at}")
        elif action == "header":
            at = rng.randrange(0, min(start, len(blob)) or 1)
            blob[at : at + 1] = bytes([rng.randrange(256)])
            case.mutations.append(f"random byte in the header at {at}")
    return bytes(blob)


def write_shards(rng: random.Random, base: Base, folder: Path, case: Case) -> None:
    """Two shards and an index, then mutations of the index or the shard set."""
    names = sorted(n for n in base.header if n != "__metadata__")
    half = rng.randrange(1, len(names))
    groups = {"model-00001-of-00002.safetensors": names[:half]}
    groups["model-00002-of-00002.safetensors"] = names[half:]
    weight_map = {}
    for file, members in groups.items():
        header, chunks, offset = {}, [], 0
        for name in members:
            begin, end = base.header[name]["data_offsets"]
            chunks.append(base.data[begin:end])
            header[name] = {**base.header[name], "data_offsets": [offset, offset + end - begin]}
            offset += end - begin
            weight_map[name] = file
        (folder / file).write_bytes(safetensors_bytes(header, b"".join(chunks)))
    index: Any = {"metadata": {}, "weight_map": weight_map}
    for _ in range(rng.randint(1, 2)):
        action = rng.choice(
            ["wrong", "missing", "outside", "absolute", "type", "map", "stray", "dup", "drop"]
        )
        name = rng.choice(names)
        if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
            break  # an earlier mutation replaced the map: nothing left to mutate in it
        home = next(f for f, members in groups.items() if name in members)
        weight_map = {**weight_map, name: home}  # an earlier "drop" may have removed it
        if action == "wrong":
            other = next(f for f in groups if f != weight_map[name])
            index["weight_map"][name] = other
        elif action == "missing":
            index["weight_map"][name] = "model-00003-of-00002.safetensors"
        elif action == "outside":
            file = index["weight_map"][name]
            if isinstance(file, str) and (folder / file).is_file():
                shutil.copy(folder / file, folder.parent / file)  # an input, beside M
            index["weight_map"][name] = f"../{file}"
        elif action == "absolute":
            index["weight_map"][name] = str(folder / weight_map[name])
        elif action == "type":
            index["weight_map"][name] = rng.choice([3, None, [], {"f": 1}])
        elif action == "map":
            index = rng.choice([{"weight_map": []}, {"weight_map": "x"}, [], {"metadata": {}}])
        elif action == "stray":
            (folder / "stray.safetensors").write_bytes(rng.choice([b"junk", b"\0" * 16]))
        elif action == "dup":
            file = weight_map[name]
            other = next(f for f in groups if f != file)
            begin, end = base.header[name]["data_offsets"]
            header = {name: {**base.header[name], "data_offsets": [0, end - begin]}}
            (folder / "extra.safetensors").write_bytes(
                safetensors_bytes(header, base.data[begin:end])
            )
            index["weight_map"][name] = rng.choice([file, other, "extra.safetensors"])
        else:
            index["weight_map"].pop(name, None)
        case.mutations.append(f"index: {action} {name}")
        if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
            break
    (folder / INDEX).write_text(json.dumps(index))


CONFIG_EXTRA_KEYS = [
    "num_kv_shared_layers",
    "per_layer_config",
    "text_config",
    "global_head_dim",
    "num_global_key_value_heads",
    "attention_k_eq_v",
    "vocab_size_per_layer_input",
    "tie_word_embeddings",
    "torch_dtype",
    "eos_token_id",
    "bos_token_id",
    "pad_token_id",
    "layer_types",
    "rope_parameters",
    "final_logit_softcapping",
    "use_double_wide_mlp",
    "enable_moe_block",
    "use_bidirectional_attention",
]


def leaf_paths(data: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every node of a JSON document (objects and lists walked)."""
    if prefix:
        yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaf_paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data[:4]):
            yield from leaf_paths(value, (*prefix, i))


def set_path(data: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> None:
    for key in path[:-1]:
        data = data[key]
    if delete:
        del data[path[-1]]
    else:
        data[path[-1]] = value


def path_text(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def mutate_json(rng: random.Random, doc: Any, case: Case, extra_keys: list[str]) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        paths = list(leaf_paths(doc))
        roll = rng.random()
        if roll < 0.02:
            doc = rng.choice([[], "x", 3, None])
            case.mutations.append(f"document = {describe(doc)}")
            break
        if roll < 0.2 and extra_keys and isinstance(doc, dict):
            key = rng.choice(extra_keys)
            value = any_value(rng)
            doc[key] = value
            case.mutations.append(f"{key} = {describe(value)}")
            continue
        if not paths:
            break
        path = rng.choice(paths)
        if rng.random() < 0.15:
            set_path(doc, path, None, delete=True)
            case.mutations.append(f"delete {path_text(path)}")
            continue
        value = any_value(rng)
        set_path(doc, path, value)
        case.mutations.append(f"{path_text(path)} = {describe(value)}")
    return doc


SIZE_KEYS = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "global_head_dim",
    "hidden_size_per_layer_input",
    "vocab_size_per_layer_input",
    "num_kv_shared_layers",
    "sliding_window",
    "max_position_embeddings",
    "num_hidden_layers",
]


def plausible_sizes(rng: random.Random, config: dict[str, Any], case: Case) -> dict[str, Any]:
    """Small but unusual architecture sizes (odd widths, one head, tiny windows) that pass
    validation more often and so reach planning, graph building and the writer."""
    config = copy.deepcopy(config)
    for key in rng.sample(SIZE_KEYS, rng.randint(1, 4)):
        value = rng.choice([1, 2, 3, 4, 6, 7, 8, 12, 16, 24, 31, 32, 48, 56, 96, 130])
        if key == "num_hidden_layers":
            value = rng.randint(1, 9)
            config["layer_types"] = [
                rng.choice(["sliding_attention", "full_attention"]) for _ in range(value)
            ]
        config[key] = value
        case.mutations.append(f"{key} = {value}")
    return config


def random_options(rng: random.Random, case: Case, wild: bool) -> list[str]:
    """Build options, mostly valid; ``wild`` adds out-of-range values."""
    argv: list[str] = []
    picks = {
        "--ep": ["cpu", "webgpu", "cuda", "dml", "trt-rtx"] + (["tpu", ""] if wild else []),
        "--dtype": ["fp32", "fp16", "bf16"],
        "--weight-bits": ["4", "8", "none"] + (["3", "x"] if wild else []),
        "--embedding-bits": ["4", "8", "none"] + (["2"] if wild else []),
        "--block-size": ["16", "32", "64", "128", "256"] + (["48", "0", "1e9"] if wild else []),
        "--max-length": ["2", "8", "64", "100", "1e9"] + (["0", "-3", "2.5", "x"] if wild else []),
        "--max-buffer-size": ["1KiB", "4KiB", "64KiB", "256MiB"] + (["0", "lots"] if wild else []),
        "--attention": ["auto", "gqa", "standard"],
        "--graph-capture": ["auto", "on", "off"],
        "--keep-float": ["layers.*.mlp.*", "*per_layer*", "embed_tokens.weight"]
        + (["nothing", "["] if wild else []),
        "--quant-method": ["rtn", "search"],
        "--accuracy-level": ["0", "4"] + (["9"] if wild else []),
    }
    for flag in rng.sample(sorted(picks), rng.randint(0, 4)):
        argv += [flag, rng.choice(picks[flag])]
    for flag in ("--symmetric", "--force", "--no-quantize-lm-head"):
        if rng.random() < 0.15:
            argv.append(flag)
    if argv:
        case.mutations.append("options " + " ".join(argv))
    return argv


# ------------------------------------------------------------------------------ cases


def prepare(base: Base, seed: int, index: int, folder: Path) -> Case:
    """Write the mutated inputs of case ``index`` into ``folder``; returns the case."""
    rng = random.Random(f"{seed}:{index}")
    kind = KINDS[index % len(KINDS)] if rng.random() < 0.7 else rng.choice(KINDS)
    case = Case(index, kind)
    model, out = folder / "M", folder / "out" / "pkg"
    if kind in ("genai", "manifest"):
        package = folder / "P"
        package.mkdir()
        for item in base.package.iterdir():
            os.link(item, package / item.name)
        name, doc = (
            ("genai_config.json", base.genai)
            if kind == "genai"
            else ("export_studio.json", base.manifest)
        )
        mutated = mutate_json(rng, doc, case, [])
        (package / name).unlink()
        (package / name).write_text(json.dumps(mutated))
        command = rng.choice(["bench", "bench", "audit", "genai"])
        if command == "audit":
            case.argv = ["audit", str(package), "--no-placement"]
        else:
            runtime = ["--runtime", "genai"] if command == "genai" else []
            lengths = rng.choice([["--prompt-len", "4", "--new-tokens", "2"], []])
            case.argv = ["bench", str(package), *runtime, "--repeats", "1", "--warmup", "0"]
            case.argv += [*lengths, "--graph-capture", "off", "--quiet"]
        return case
    model.mkdir()
    config = base.config
    random_weights = False
    if kind == "header":
        (model / WEIGHTS).write_bytes(mutate_header(rng, base, case))
    elif kind == "bytes":
        (model / WEIGHTS).write_bytes(mutate_bytes(rng, base, case))
    elif kind == "shards":
        write_shards(rng, base, model, case)
    elif kind == "config":
        if rng.random() < 0.5:
            config = plausible_sizes(rng, base.config, case)
        else:
            config = mutate_json(rng, base.config, case, CONFIG_EXTRA_KEYS)
        if rng.random() < 0.1 and isinstance(config, dict):
            config = {"model_type": "gemma4", "text_config": config}
            case.mutations.append("nested under text_config (multimodal)")
        random_weights = rng.random() < 0.6
        if not random_weights:
            os.link(base.root / "base-model" / WEIGHTS, model / WEIGHTS)
    else:  # options
        os.link(base.root / "base-model" / WEIGHTS, model / WEIGHTS)
    (model / "config.json").write_text(json.dumps(config))
    options = random_options(rng, case, wild=kind == "options") if rng.random() < 0.5 else []
    command = rng.choice(["build"] * 6 + ["info", "plan"])
    if command == "info":
        case.argv = ["info", "--model", str(model)]
    elif command == "plan":
        case.argv = ["plan", "--model", str(model), *options]
    else:
        case.argv = ["build", "--model", str(model), *options, "--quiet"]
        case.argv += ["--random-weights"] if random_weights else []
        case.argv.append(str(out))
    return case


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for path in sorted(folder.rglob("*")):
        try:
            info = path.lstat()
        except OSError:
            continue
        out[str(path.relative_to(folder))] = (info.st_size, info.st_mtime_ns)
    return out


def leftovers(folder: Path, inputs: dict[str, tuple[int, int]], built: bool) -> list[str]:
    """What a case left behind besides its inputs and (after a build) its package: anything
    new (a staging or ``.old`` folder, an empty parent) or any input changed."""
    now = snapshot(folder)
    expected = {"out", "out/pkg"} if built else set()
    new = [
        name
        for name in now
        if name not in inputs and name not in expected and not name.startswith("out/pkg/")
    ]
    found = [f"new: {name}" for name in new[:3]]
    changed = [name for name in inputs if now.get(name) != inputs[name]]
    if changed:
        found.append(f"inputs changed: {changed[:3]}")
    if built and not (folder / "out" / "pkg" / "export_studio.json").is_file():
        found.append("the build succeeded but out/pkg has no manifest")
    return found


def run_cli(argv: list[str]) -> tuple[int | None, str, str, str | None]:
    """The CLI in this process: (exit code, stdout, stderr, traceback or None)."""
    from engine.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    code: int | None = None
    failure = None
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:
            failure = traceback.format_exc()
    return code, stdout.getvalue(), stderr.getvalue(), failure


def runs_on_cpu(argv: list[str]) -> bool:
    """A package this build wrote that the CPU EP can run (any EP's graph, not bf16)."""
    if argv[0] != "build":
        return False
    options = dict(itertools.pairwise(argv))
    return options.get("--dtype") != "bf16" and options.get("--ep") not in ("cuda", "trt-rtx")


def run_package(package: Path, tmp: Path) -> str:
    """Why a built package fails to generate on the CPU EP ('' when it runs): a prompt and
    greedy tokens filling as much of its length as a short run needs (at least 1 + 1)."""
    from engine.errors import EngineError
    from engine.runtime.bench import sequence_limit
    from engine.runtime.package import open_package
    from engine.runtime.runner import greedy_tokens

    try:
        opened = open_package(package)
        limit = sequence_limit(opened) or 64
        prompt = [min(3, opened.vocab_size - 1)] * min(4, limit - 1)
        new = min(8, limit - len(prompt))
        tokens = greedy_tokens(package, prompt, new, ep="cpu")
    except EngineError as exc:
        return f"the built package does not run: {exc}"
    except Exception:
        return "the built package does not run: " + traceback.format_exc().strip().splitlines()[-1]
    if len(tokens) != new:
        return f"the built package generated {len(tokens)} tokens, not {new}"
    return ""


def classify(case: Case, folder: Path, inputs: dict[str, tuple[int, int]], tmp: Path) -> Result:
    code, stdout, stderr, failure = run_cli(case.argv)

    def result(outcome: str, detail: str) -> Result:
        warned = stderr.count("Warning")
        return Result(case.index, case.kind, outcome, detail, case.mutations, case.argv, 0, warned)

    if failure is not None:
        return result("traceback", failure.strip().splitlines()[-1])
    left = leftovers(folder, inputs, code == 0 and case.argv[0] == "build")
    # onnxruntime keeps a session id in $TMPDIR/.ses (one file, rewritten): not ours.
    stray = sorted(p.name for p in tmp.iterdir() if p.name != ".ses")
    if stray:
        left.append(f"temporary files: {stray[:3]}")
        for path in tmp.iterdir():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.name != ".ses":
                path.unlink()
    if "Traceback (most recent call last)" in stderr + stdout:
        return result("traceback", "printed a traceback")
    if left:
        return result("leftover", "; ".join(left))
    if code == 0:
        if runs_on_cpu(case.argv):
            broken = run_package(folder / "out" / "pkg", tmp)
            if broken:
                return result("broken package", broken)
        return result("ok", "")
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    message = next(
        (
            line
            for line in lines
            if line.startswith(("error:", "cancelled:")) or ": error: " in line
        ),
        None,
    )
    if message is not None:
        return result("clear error", message)
    return result("traceback", f"exit {code} without an error line: {lines[-1:]}")


# ----------------------------------------------------------------------------- workers


def worker(base: Base, seed: int, tasks: Any, results: Any, work: Path) -> None:
    import resource

    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # onnxruntime's own logging goes to fd 2
    tmp = work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = str(tmp)
    while True:
        index = tasks.get()
        if index is None:
            return
        results.put(("started", index, os.getpid()))
        folder = work / f"case-{index}"
        folder.mkdir()
        started = time.perf_counter()
        try:
            case = prepare(base, seed, index, folder)
            result = classify(case, folder, snapshot(folder), tmp)
        except BaseException:
            detail = "fuzzer error: " + traceback.format_exc().strip().splitlines()[-1]
            result = Result(index, "?", "traceback", detail, [], [], 0.0)
        result.seconds = time.perf_counter() - started
        shutil.rmtree(folder, ignore_errors=True)
        results.put(("done", index, asdict(result)))


def run(
    cases: int = 200,
    seed: int = 0,
    workers: int = 2,
    timeout: float = 300.0,
    only: list[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the fuzz cases; returns the report (see the module docstring)."""
    import engine.cli
    import engine.pipeline
    import engine.runtime.bench  # noqa: F401

    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="fuzz-inputs-"))
    try:
        base = make_base(root / "base")
        indices = list(only) if only else list(range(cases))
        context = mp.get_context("fork")
        tasks: Any = context.Queue()
        results: Any = context.Queue()
        for index in indices:
            tasks.put(index)
        # pid -> (process, the case it runs or None, since when)
        running: dict[int, tuple[Any, int | None, float]] = {}
        spawned = 0

        def spawn() -> None:
            nonlocal spawned
            process = context.Process(
                target=worker, args=(base, seed, tasks, results, root / f"worker-{spawned}")
            )
            process.start()
            spawned += 1
            running[process.pid] = (process, None, time.monotonic())

        for _ in range(max(1, min(workers, len(indices)))):
            spawn()
        reports: dict[int, Result] = {}
        while len(reports) < len(indices):
            try:
                state, index, payload = results.get(timeout=1.0)
            except queue.Empty:
                state = None
            if state == "started" and payload in running:
                running[payload] = (running[payload][0], index, time.monotonic())
            elif state == "done":
                reports[index] = Result(**payload)
                if progress is not None:
                    progress(len(reports), len(indices))
            for pid, (process, current, since) in list(running.items()):
                if current is None or current in reports:
                    continue
                late = time.monotonic() - since > timeout
                if not late and process.is_alive():
                    continue
                if late:
                    process.kill()
                process.join()
                detail = (
                    f"no result after {timeout:.0f} s"
                    if late
                    else f"the worker died (exit code {process.exitcode})"
                )
                outcome = "hang" if late else "traceback"
                reports[current] = Result(current, "?", outcome, detail, [], [], timeout)
                del running[pid]
                spawn()
        for _ in running:
            tasks.put(None)
        for process, _, _ in running.values():
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(seed, [reports[i] for i in indices], time.perf_counter() - started)


def report(seed: int, results: list[Result], seconds: float) -> dict[str, Any]:
    by_kind: dict[str, Counter[str]] = {}
    for r in results:
        by_kind.setdefault(r.kind, Counter())[r.outcome] += 1
    errors = Counter(_shape(r.detail) for r in results if r.outcome == "clear error")
    return {
        "seed": seed,
        "cases": len(results),
        "seconds": round(seconds, 1),
        "outcomes": {o: sum(1 for r in results if r.outcome == o) for o in OUTCOMES},
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "ok_with_warnings": sum(1 for r in results if r.outcome == "ok" and r.warnings),
        "slowest_case_seconds": round(max((r.seconds for r in results), default=0.0), 2),
        "common_errors": dict(errors.most_common(12)),
        "findings": [asdict(r) for r in results if r.outcome not in ("clear error", "ok")][:50],
    }


def _shape(message: str) -> str:
    """A message with its paths, names and numbers blanked, to count kinds of errors."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"|/[^\s:;,)]+", "_", message)
    text = re.sub(r"-?\d[\d,.]*(e[+-]?\d+)?", "N", text)
    return text[:90]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a hang")
    parser.add_argument("--only", type=int, nargs="*", help="replay these case indices")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()

    def show(done: int, total: int) -> None:
        if not args.quiet and (done % 100 == 0 or done == total):
            print(f"{done}/{total}", file=sys.stderr, flush=True)

    result = run(args.cases, args.seed, args.workers, args.timeout, args.only, progress=show)
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
