"""Seeded mutations for the input fuzzer (benchmarks/fuzz_inputs.py): the values it tries,
the unmutated base inputs, and the mutators of safetensors headers and bytes, shard indexes,
JSON documents (config.json, genai_config.json, the manifest) and export options."""

from __future__ import annotations

import copy
import json
import random
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INDEX = "model.safetensors.index.json"


@dataclass
class Case:
    """One fuzz case: what was mutated and the command that runs on the result."""

    index: int
    kind: str
    mutations: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)


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
