"""Cases of the input fuzzer (benchmarks/fuzz_inputs.py) for what a user hands the commands
besides weights and configs: media files, tokenizer files, lengths and numeric options,
checkpoints of other formats (PyTorch ``.bin``, FP8, PEFT adapters), and damaged package files.

Each kind writes its inputs into the case's folder and sets the command line; the fuzzer then
classifies the outcome as for every other kind. Packages damaged on purpose must not be
reported as good: :func:`must_fail` says which mutations make every command that reads the
damaged file fail.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import wave
import zlib
from dataclasses import dataclass
from pathlib import Path

from fuzz_mutations import INTS, Case, describe

USER_KINDS = ("media", "tokenizer", "lengths", "foreign", "package_files")
WEIGHTS = "model.safetensors"
NUMBERS: list[str] = [*(str(n) for n in INTS), "1.5", "x", "", "1e3", "-0", "0x10", "  7"]
FOREIGN = ("bin", "bin_beside", "fp8_dtype", "quant_config", "adapter", "adapter_only", "gguf",
           "scales")  # fmt: skip
"""Checkpoints of other formats, or with a stranger beside the weights."""
DAMAGES_THAT_BREAK = ("truncated", "emptied", "removed", "garbage")
"""Package-file mutations after which no command that reads the file may succeed."""


@dataclass(frozen=True)
class UserBase:
    """Unmutated inputs of the user kinds (never modified: cases copy or hard-link)."""

    text_model: Path
    """A tiny text checkpoint with a tokenizer."""
    text_package: Path
    """Its CPU package (max_length 64)."""
    mm_model: Path
    """A tiny multimodal checkpoint (vision and audio towers, tokenizer, processor config)."""
    mm_package: Path
    """Its CPU package."""


def make_user_base(root: Path) -> UserBase:
    from engine.options import ExportOptions
    from engine.pipeline import export
    from tests._support.fake_checkpoint import tiny_config, write_checkpoint
    from tests._support.tiny_gemma import make_tokenizer
    from tests._support.tiny_gemma_mm import (
        make_mm_checkpoint,
        make_mm_tokenizer,
        write_processor_config,
    )

    config = tiny_config()
    text_model = write_checkpoint(root / "text-model", config)
    make_tokenizer(text_model, config["vocab_size"])
    text_package = root / "text-package"
    export(text_package, model_dir=text_model, options=ExportOptions(max_length=64))
    mm_model = root / "mm-model"
    model = make_mm_checkpoint(mm_model)
    make_mm_tokenizer(mm_model, model.config.text_config.vocab_size)
    write_processor_config(mm_model)
    mm_package = root / "mm-package"
    export(mm_package, model_dir=mm_model, options=ExportOptions())
    return UserBase(text_model, text_package, mm_model, mm_package)


def link_tree(source: Path, target: Path) -> None:
    """``target`` as hard links of ``source``'s files: replace a file before changing it."""
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.is_file():
            os.link(item, target / item.name)


def replace_bytes(path: Path, data: bytes) -> None:
    """New contents for a hard-linked file, leaving the base's copy as it was."""
    path.unlink()
    path.write_bytes(data)


# ------------------------------------------------------------------------------ media


def wav_bytes(rng: random.Random, case: Case) -> bytes:
    samples = rng.choice([0, 1, 2, 10, 99, 100, 400, 1599, 1600, 16_000, 40_000])
    rate = rng.choice([16_000] * 4 + [8_000, 44_100, 1, 100])
    channels, width = rng.choice([1, 1, 1, 2]), rng.choice([2, 2, 1, 4])
    case.mutations.append(f"WAV of {samples} samples, {rate} Hz, {channels} ch, {8 * width} bit")
    path_bytes = _WavBuffer()
    with wave.open(path_bytes, "wb") as f:  # type: ignore[arg-type]
        f.setnchannels(channels)
        f.setsampwidth(width)
        f.setframerate(rate)
        f.writeframes(bytes(rng.getrandbits(8) for _ in range(samples * channels * width)))
    return path_bytes.data


class _WavBuffer:
    """The file object ``wave`` writes to, in memory (it seeks back to patch the header)."""

    def __init__(self) -> None:
        self.data = b""
        self.pos = 0

    def write(self, chunk: bytes) -> int:
        end = self.pos + len(chunk)
        self.data = self.data[: self.pos] + bytes(chunk) + self.data[end:]
        self.pos = end
        return len(chunk)

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else len(self.data) + pos if whence == 2 else self.pos + pos
        return self.pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def png_bytes(rng: random.Random, case: Case) -> bytes:
    width = rng.choice([1, 2, 3, 16, 48, 64, 200, 4000])
    height = rng.choice([1, 2, 3, 16, 48, 64, 200, 4000])
    if width * height > 2_000_000:
        height = max(1, 2_000_000 // width)
    case.mutations.append(f"PNG {width}x{height}")
    raw = b"".join(b"\x00" + bytes(rng.getrandbits(8) for _ in range(width * 3)) for _ in [0])
    raw = raw * height  # one random row repeated: the size matters, not the pixels

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def damaged(rng: random.Random, data: bytes, case: Case, what: str) -> bytes:
    """``data`` as it is, truncated, emptied or replaced by garbage."""
    choice = rng.random()
    if choice < 0.6:
        return data
    if choice < 0.8:
        cut = rng.randrange(len(data)) if data else 0
        case.mutations.append(f"{what} truncated to {cut} of {len(data)} bytes")
        return data[:cut]
    if choice < 0.9:
        case.mutations.append(f"{what} empty")
        return b""
    case.mutations.append(f"{what} replaced by random bytes")
    return bytes(rng.getrandbits(8) for _ in range(rng.choice([4, 64, 4096])))


def prepare_media(rng: random.Random, base: UserBase, folder: Path, case: Case) -> None:
    media: list[str] = []
    for _ in range(rng.choice([1, 1, 2])):
        if rng.random() < 0.5:
            path = folder / f"clip{len(media)}.wav"
            path.write_bytes(damaged(rng, wav_bytes(rng, case), case, path.name))
            media += ["--audio", str(path)]
        else:
            path = folder / f"image{len(media)}.png"
            path.write_bytes(damaged(rng, png_bytes(rng, case), case, path.name))
            media += ["--image", str(path)]
    if rng.random() < 0.1:
        media += ["--image", str(folder / "missing.png")]
        case.mutations.append("an image that does not exist")
    prompt = rng.choice(
        [[], ["--prompt", "Describe."], ["--prompt", ""], ["--prompt", "<image> and <audio>"]]
    )
    if rng.random() < 0.5:
        case.argv = ["verify", str(base.mm_package), "--model", str(base.mm_model), "--steps", "2"]
    else:
        case.argv = ["bench", str(base.mm_package), "--repeats", "1", "--warmup", "0"]
        case.argv += ["--new-tokens", "2", "--quiet"]
    case.argv += [*media, *prompt]


# -------------------------------------------------------------------------- tokenizer


def prepare_tokenizer(rng: random.Random, base: UserBase, folder: Path, case: Case) -> None:
    """A checkpoint whose tokenizer files are damaged, odd or missing."""
    model = folder / "M"
    link_tree(base.text_model, model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = model / name
        if not path.is_file():
            continue
        choice = rng.random()
        if choice < 0.15:
            path.unlink()
            case.mutations.append(f"{name} removed")
            continue
        data = path.read_bytes()
        if choice < 0.3:
            replace_bytes(path, json.dumps(rng.choice([{}, [], None, 7, {"model": 1}])).encode())
            case.mutations.append(f"{name} is other JSON")
        elif choice < 0.7:
            replace_bytes(path, damaged(rng, data, case, name))
    out = folder / "out" / "pkg"
    case.argv = ["build", "--model", str(model), "--max-length", "64", "--quiet", str(out)]


# ---------------------------------------------------------------------------- lengths


def prepare_lengths(rng: random.Random, base: UserBase, case: Case) -> None:
    def number() -> str:
        value = rng.choice(NUMBERS)
        case.mutations.append(describe(value))
        return value

    command = rng.choice(["bench", "bench", "verify", "plan"])
    if command == "plan":
        case.argv = ["plan", "--preset", "gemma4-tiny", "--top", number()]
        return
    if command == "verify":
        flags = ["--steps", "--prompt-len", "--seed"]
        case.argv = ["verify", str(base.text_package), "--model", str(base.text_model)]
    else:
        flags = ["--prompt-len", "--new-tokens", "--repeats", "--warmup", "--threads", "--seed"]
        case.argv = ["bench", str(base.text_package), "--quiet"]
        case.argv += rng.choice([[], ["--runtime", "genai"]])
        # Keep the timed work small unless the case sets it: sizes are what is fuzzed.
        case.argv += ["--repeats", "1", "--warmup", "0", "--new-tokens", "2"]
    for flag in rng.sample(flags, rng.randint(1, 3)):
        case.argv += [flag, number()]
        case.mutations[-1] = f"{flag} {case.mutations[-1]}"
    if command == "verify" and "--steps" not in case.argv:
        case.argv += ["--steps", "2"]


# ---------------------------------------------------------------------------- foreign


def prepare_foreign(rng: random.Random, base: UserBase, folder: Path, case: Case) -> None:
    """A checkpoint in another format, or with a stranger beside it."""
    model = folder / "M"
    link_tree(base.text_model, model)
    config = json.loads((model / "config.json").read_text())
    choice = rng.choice(FOREIGN)
    case.mutations.append(choice)
    if choice in ("bin", "bin_beside", "adapter_only", "gguf"):
        if choice != "bin_beside":
            (model / WEIGHTS).unlink()
        if choice.startswith("bin"):
            (model / "pytorch_model.bin").write_bytes(b"PK\x03\x04 a torch zip archive")
        elif choice == "gguf":
            (model / "model.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    if choice in ("adapter", "adapter_only"):
        (model / "adapter_config.json").write_text(
            json.dumps({"peft_type": "LORA", "r": 8, "base_model_name_or_path": "x"})
        )
        shutil.copyfile(base.text_model / WEIGHTS, model / "adapter_model.safetensors")
    if choice in ("fp8_dtype", "scales"):
        data = (model / WEIGHTS).read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
        names = [n for n in header if n != "__metadata__" and n.endswith("proj.weight")]
        for name in rng.sample(names, min(len(names), rng.choice([1, 4]))):
            entry = header[name]
            if choice == "fp8_dtype":
                entry["dtype"] = "F8_E4M3"
                start, end = entry["data_offsets"]
                entry["data_offsets"] = [start, start + (end - start) // 4]
            else:
                header[name.removesuffix("weight") + "weight_scale"] = dict(entry)
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        replace_bytes(model / WEIGHTS, struct.pack("<Q", len(raw)) + raw + data[8 + length :])
    if choice == "quant_config" or (choice == "fp8_dtype" and rng.random() < 0.5):
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3"}
        (model / "config.json").unlink()
        (model / "config.json").write_text(json.dumps(config))
    out = folder / "out" / "pkg"
    command = rng.choice(["build"] * 4 + ["plan", "info"])
    if command == "build":
        case.argv = ["build", "--model", str(model), "--quiet", str(out)]
    else:
        case.argv = [command, "--model", str(model)]


# ---------------------------------------------------------------------- package files


def prepare_package_files(rng: random.Random, base: UserBase, folder: Path, case: Case) -> None:
    package = folder / "P"
    source = base.text_package if rng.random() < 0.7 else base.mm_package
    link_tree(source, package)
    files = sorted(p.name for p in package.iterdir())
    name = rng.choice([n for n in files if n.endswith((".onnx", ".onnx.data"))] * 3 + files)
    path = package / name
    data = path.read_bytes()
    choice = rng.choice(DAMAGES_THAT_BREAK)
    if choice == "truncated":
        cut = rng.randrange(len(data)) if data else 0
        replace_bytes(path, data[:cut])
        case.mutations.append(f"{name} truncated to {cut} of {len(data)} bytes")
    elif choice == "emptied":
        replace_bytes(path, b"")
        case.mutations.append(f"{name} emptied")
    elif choice == "removed":
        path.unlink()
        case.mutations.append(f"{name} removed")
    else:
        replace_bytes(path, bytes(rng.getrandbits(8) for _ in range(min(len(data), 4096))))
        case.mutations.append(f"{name} replaced by random bytes")
    command = rng.choice(["bench", "bench_genai", "audit", "audit_placement", "verify"])
    if command.startswith("bench"):
        case.argv = ["bench", str(package), "--repeats", "1", "--warmup", "0", "--quiet"]
        case.argv += ["--new-tokens", "2"]
        case.argv += ["--runtime", "genai"] if command == "bench_genai" else []
    elif command.startswith("audit"):
        case.argv = ["audit", str(package)]
        case.argv += [] if command == "audit_placement" else ["--no-placement"]
    else:
        model = base.text_model if source == base.text_package else base.mm_model
        case.argv = ["verify", str(package), "--model", str(model), "--steps", "2"]


def must_fail(case: Case) -> str:
    """Why this case's command may not succeed ('' when it may): a damaged package file
    that the command needs. A manifest may be missing (another exporter's package has
    none); bench runs token ids, so it needs no tokenizer; verify vouches for genai running
    text, so it needs both tokenizer files."""
    if case.kind != "package_files" or not case.mutations:
        return ""
    mutation = case.mutations[0]
    name = mutation.split(" ", 1)[0]
    graph = (".onnx", "genai_config.json")
    weights = (".onnx.data",)
    manifest = () if mutation.endswith("removed") else ("export_studio.json",)
    tokenizer = ("tokenizer.json", "tokenizer_config.json")
    command = case.argv[0]
    needs = {
        "audit": graph if "--no-placement" in case.argv else graph + weights,
        "bench": graph + weights + manifest,
        "verify": graph + weights + manifest + tokenizer,
    }.get(command, ())
    if name.endswith(needs):
        return f"{command} succeeded on a package whose {mutation}"
    return ""


def prepare_user_case(
    kind: str, rng: random.Random, base: UserBase, folder: Path, case: Case
) -> None:
    """Write case ``kind``'s inputs into ``folder`` and set ``case.argv``."""
    if kind == "media":
        prepare_media(rng, base, folder, case)
    elif kind == "tokenizer":
        prepare_tokenizer(rng, base, folder, case)
    elif kind == "lengths":
        prepare_lengths(rng, base, case)
    elif kind == "foreign":
        prepare_foreign(rng, base, folder, case)
    else:
        prepare_package_files(rng, base, folder, case)


def tokenizer_problem(package: Path) -> str:
    """Why onnxruntime-genai cannot tokenize with a built package ('' when it can, or when
    the package has no tokenizer and the build said so)."""
    if not (package / "tokenizer.json").is_file():
        return ""
    import onnxruntime_genai as og

    try:
        tokenizer = og.Tokenizer(og.Model(str(package)))
        tokenizer.encode("hello")
    except Exception as exc:
        return f"genai cannot load the package's tokenizer: {str(exc).splitlines()[0][:160]}"
    return ""
