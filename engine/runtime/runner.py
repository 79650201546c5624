"""Our generation loop over a package with onnxruntime: greedy or seeded sampling.

Two KV-cache modes:

- ``growing``: past KV starts empty and each step's present (kept on the device) is the
  next step's past; the attention mask is ``[1, total]``. Works for every package.
- ``shared``: one preallocated ``[1, kv_heads, max_length, head_dim]`` buffer per cache
  is bound as both past and present (GroupQueryAttention writes in place); the mask is
  ``[1, total]`` as onnxruntime-genai passes it. Needs ``past_present_share_buffer``.

Graph capture (shared mode only) records the decode step once and replays it: the token
and the static ``[1, max_length]`` mask (ones then zeros, as genai passes it under
capture) are written into pinned device buffers (:mod:`engine.runtime.device_io`), the
prefill runs outside capture (``gpu_graph_id = -1``), and logits stay pinned too. KV and
presents never leave the device; each step's logits are read back to choose the token.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from engine.errors import EngineError, OptionsError, RuntimeUnavailableError, option
from engine.progress import CancelToken
from engine.runtime.device_io import (
    BF16,
    BF16_TYPE,
    StaticTensors,
    device_value,
    host_value,
)
from engine.runtime.generation import Generation
from engine.runtime.package import Package, open_package
from engine.runtime.sampling import GREEDY, Sampler
from engine.runtime.session import (
    Placement,
    SessionHandle,
    create_session,
    one_line,
    read_placement,
)

KvMode = Literal["auto", "shared", "growing"]
_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bfloat16)": BF16}
_INDEX = {"tensor(int32)": np.int32, "tensor(int64)": np.int64}


@dataclass(frozen=True)
class RunnerOptions:
    """How :class:`Runner` runs a package."""

    ep: str | None = None
    """Short EP name; None = the EP the package was built for."""
    kv_mode: KvMode = "auto"
    """auto = shared when the package declares past_present_share_buffer, else growing."""
    graph_capture: bool = False
    max_length: int | None = None
    """Shared-buffer KV length; None = genai_config's search.max_length."""
    threads: int | None = None


class Runner:
    """A loaded package ready to generate; holds one onnxruntime session.

    Args:
        package: A package folder or an opened :class:`Package`.
        options: EP, KV mode, graph capture.

    Raises:
        PackageError: The folder is not a runnable package.
        RuntimeUnavailableError: The EP is missing here or ran nothing.
        OptionsError: A mode the package cannot run (e.g. shared KV without GQA).
    """

    def __init__(
        self, package: Package | str | os.PathLike[str], options: RunnerOptions | None = None
    ) -> None:
        self.package = package if isinstance(package, Package) else open_package(package)
        if self.package.multimodal:
            raise RuntimeUnavailableError(
                f"{self.package.path.name} is a multimodal package (embedding, decoder and "
                f"encoder sessions); run it through onnxruntime-genai with "
                f"{option('runtime', 'genai')}"
            )
        options = options or RunnerOptions()
        self.ep = options.ep or self.package.ep
        mode = options.kv_mode
        if mode == "auto":
            mode = "shared" if self.package.share_buffer else "growing"
        if mode == "shared" and not self.package.share_buffer:
            raise OptionsError(
                "this package grows its KV cache by concatenation "
                "(past_present_share_buffer is false); use the growing KV mode"
            )
        if mode == "growing" and self.package.static_kv:
            raise OptionsError(
                "this package writes its KV cache into static buffers "
                "(past_present_share_buffer); use the shared KV mode"
            )
        if options.graph_capture and mode != "shared":
            raise OptionsError(
                "graph capture needs past and present KV in one shared buffer; "
                "use a GroupQueryAttention package and the shared KV mode"
            )
        self.kv_mode: Literal["shared", "growing"] = mode
        self.graph_capture = options.graph_capture
        self.max_length = options.max_length or self.package.max_length
        self.handle: SessionHandle = create_session(
            self.package.decoder_file,
            self.ep,
            graph_capture=options.graph_capture,
            provider_options=self._provider_options(),
            threads=options.threads,
        )
        self.placement: Placement | None = None
        self._describe_io()
        self._kv: StaticTensors | None = None
        self._step_inputs: StaticTensors | None = None
        self._decode_binding: Any = None
        self._logits_value: Any = None
        self._reader: HostReader | None = None
        self._past: dict[str, Any] = {}

    @property
    def load_seconds(self) -> float:
        return self.handle.load_seconds

    @property
    def provider(self) -> str:
        """The provider that ran the nodes (known after the first generation)."""
        return self.placement.provider if self.placement else self.handle.provider

    def _provider_options(self) -> dict[str, str]:
        from engine.caps import get_caps
        from engine.runtime.package import session_provider_options

        decoder = self.package.config.get("model", {}).get("decoder", {})
        return session_provider_options(decoder, get_caps(self.ep).genai_provider)

    def _describe_io(self) -> None:
        session = self.handle.session
        io = self.package.io
        inputs = {i.name: i for i in session.get_inputs()}
        for required in (io.input_ids, io.attention_mask):
            if required not in inputs:
                raise RuntimeUnavailableError(
                    f"{self.package.decoder_file.name} has no input '{required}'; "
                    "it is not a decoder this runner can drive"
                )
        self.index_dtype = _INDEX.get(inputs[io.input_ids].type, np.int64)
        self.past_names = [n for n in inputs if io.is_past(n)]
        if not self.past_names:
            raise RuntimeUnavailableError("the decoder has no past_key_values inputs")
        self.kv_shapes: dict[str, tuple[int, int]] = {}
        float_types = {inputs[n].type for n in self.past_names}
        unsupported = float_types - set(_FLOATS)
        if unsupported:
            raise RuntimeUnavailableError(
                f"KV cache of type {', '.join(sorted(unsupported))} is not supported by this "
                f"runner; use {option('runtime', 'genai')}"
            )
        self.float_dtype = _FLOATS[next(iter(float_types))]
        for name in self.past_names:
            self.kv_shapes[name] = self._kv_dims(name, inputs[name].shape)
        self.presents = {n: io.present_for(n) for n in self.past_names}

    def _kv_dims(self, name: str, shape: Sequence[Any]) -> tuple[int, int]:
        """(KV heads, head size) of one past input: from the graph where its dims are fixed,
        else from genai_config (other exporters, e.g. onnxruntime-genai's builder, name
        them ``kv_cache_dim``)."""
        decoder = self.package.config.get("model", {}).get("decoder", {})
        configured = (decoder.get("num_key_value_heads"), decoder.get("head_size"))
        dims = []
        for dim, value, key in zip(
            (shape[1], shape[3]), configured, ("num_key_value_heads", "head_size"), strict=True
        ):
            if isinstance(dim, int):
                dims.append(dim)
            elif isinstance(value, int) and value > 0:
                dims.append(value)
            else:
                raise RuntimeUnavailableError(
                    f"{name} has a symbolic dimension ({shape}) and genai_config.json gives no "
                    f"model.decoder.{key}; use {option('runtime', 'genai')}"
                )
        return dims[0], dims[1]

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        prompt: Sequence[int],
        new_tokens: int,
        *,
        sampler: Sampler = GREEDY,
        forced: Sequence[int] | None = None,
        keep_logits: bool = False,
        stop_at_eos: bool = False,
        cancel: CancelToken | None = None,
    ) -> Generation:
        """Prefill ``prompt`` and produce up to ``new_tokens`` tokens.

        Args:
            prompt: Token ids (batch 1).
            new_tokens: Tokens to produce (the prefill produces the first).
            sampler: Greedy by default; seeded sampling otherwise.
            forced: Teacher forcing: feed these tokens instead of the chosen ones
                (``argmax`` still records the model's own choices).
            keep_logits: Keep float32 logits of every step.
            stop_at_eos: Stop after an end-of-sequence token.
            cancel: Checked between steps.
        """
        if not prompt or new_tokens < 1:
            raise OptionsError("give a non-empty prompt and at least one new token")
        if forced is not None and len(forced) < new_tokens:
            raise OptionsError(f"forced tokens: need {new_tokens}, got {len(forced)}")
        total = len(prompt) + new_tokens
        if self.kv_mode == "shared" and total > self.max_length:
            raise OptionsError(
                f"prompt + new tokens = {total} exceeds the KV buffer length {self.max_length}; "
                "use a shorter run or a larger max_length"
            )
        step = self._shared_step if self.kv_mode == "shared" else self._growing_step
        rng = sampler.rng()
        tokens: list[int] = []
        argmax: list[int] = []
        kept: list[np.ndarray] = []
        timings: list[float] = []
        prefill = first = 0.0
        eos = False
        for i in range(new_tokens):
            if cancel is not None:
                cancel.raise_if_cancelled()
            started = time.perf_counter()
            feed = list(prompt) if i == 0 else [tokens[-1]]
            try:
                logits = step(feed, len(prompt) + i, first=i == 0)  # total length so far
            except EngineError:
                raise
            except Exception as exc:  # onnxruntime raises many unrelated types
                raise RuntimeUnavailableError(
                    f"{self.handle.provider} failed on {'the prompt' if i == 0 else f'step {i}'}"
                    f" of {self.package.path.name}"
                    f"{' under graph capture' if self.graph_capture else ''}: {one_line(exc)}"
                ) from exc
            fetched = time.perf_counter()
            top = int(np.argmax(logits))
            if forced is not None:
                token = forced[i]
            else:
                token = top if sampler.greedy else sampler.pick(logits, rng)
            done = time.perf_counter()
            if i == 0:
                prefill, first = fetched - started, done - started
                if self.placement is None:
                    self.placement = read_placement(self.handle)
            else:
                timings.append(done - started)
            tokens.append(int(token))
            argmax.append(top)
            if keep_logits:
                kept.append(logits.astype(np.float32))
            if stop_at_eos and token in self.package.eos_token_ids:
                eos = True
                break
        return Generation(
            prompt_length=len(prompt),
            tokens=tuple(tokens),
            argmax=tuple(argmax),
            logits=tuple(kept),
            prefill_seconds=prefill,
            first_token_seconds=first,
            step_seconds=tuple(timings),
            stopped_at_eos=eos,
        )

    def _growing_step(self, feed: list[int], total: int, *, first: bool) -> np.ndarray:
        io = self.package.io
        binding = self.handle.session.io_binding()
        binding.bind_cpu_input(io.input_ids, np.array([feed], dtype=self.index_dtype))
        binding.bind_cpu_input(io.attention_mask, np.ones((1, total), dtype=self.index_dtype))
        for name in self.past_names:
            if first:
                heads, dim = self.kv_shapes[name]
                empty = np.zeros((1, heads, 0, dim), dtype=self.float_dtype)
                binding.bind_ortvalue_input(name, host_value(empty))
            else:
                binding.bind_ortvalue_input(name, self._past[name])
        names = [io.logits, *self.presents.values()]
        for name in names:
            binding.bind_output(name, self.handle.device)
        self.handle.session.run_with_iobinding(binding)
        outputs = dict(zip(names, binding.get_outputs(), strict=True))
        self._past = {past: outputs[present] for past, present in self.presents.items()}
        return self._last_row(outputs[io.logits])

    def _shared_step(self, feed: list[int], total: int, *, first: bool) -> np.ndarray:
        """One run with the KV in the shared buffers.

        Like onnxruntime-genai: without capture the mask is ``[1, total]``; under capture
        it is the static ``[1, max_length]`` (ones then zeros) in pinned device buffers.
        """
        import onnxruntime as ort

        io = self.package.io
        session = self.handle.session
        if self._kv is None:
            kv_specs: dict[str, tuple[tuple[int, ...], np.dtype]] = {
                n: ((1, heads, self.max_length, dim), np.dtype(self.float_dtype))
                for n, (heads, dim) in self.kv_shapes.items()
            }
            self._kv = StaticTensors(kv_specs, self.handle.device, self.handle.provider)
            self._kv.write({n: np.zeros(s, dtype=d) for n, (s, d) in kv_specs.items()})
        ids = np.array([feed], dtype=self.index_dtype)
        width = self.max_length if self.graph_capture else total
        mask = np.zeros((1, width), dtype=self.index_dtype)
        mask[0, :total] = 1
        if first:
            binding = session.io_binding()
            binding.bind_cpu_input(io.input_ids, ids)
            binding.bind_cpu_input(io.attention_mask, mask)
            self._bind_kv(binding)
            binding.bind_output(io.logits, self.handle.device)
            options = ort.RunOptions()
            if self.graph_capture:
                # The prompt's shape differs from a decode step's: run it outside capture.
                options.add_run_config_entry("gpu_graph_id", "-1")
            session.run_with_iobinding(binding, options)
            return self._last_row(binding.get_outputs()[-1])
        if self._decode_binding is None:
            # One binding for every decode step: KV (and, under capture, the pinned token
            # and mask) stay bound; only what changes is rebound.
            binding = session.io_binding()
            if self.graph_capture:
                specs: dict[str, tuple[tuple[int, ...], np.dtype]] = {
                    io.input_ids: ((1, 1), np.dtype(self.index_dtype)),
                    io.attention_mask: ((1, self.max_length), np.dtype(self.index_dtype)),
                }
                self._step_inputs = StaticTensors(specs, self.handle.device, self.handle.provider)
                self._step_inputs.write({io.input_ids: ids, io.attention_mask: mask})
                for name, value in self._step_inputs.values.items():
                    binding.bind_ortvalue_input(name, value)
            self._bind_kv(binding)
            self._logits_value = self._logits_buffer() if self.graph_capture else None
            if self._logits_value is not None:
                binding.bind_ortvalue_output(io.logits, self._logits_value)
            else:
                binding.bind_output(io.logits, self.handle.device)
            self._decode_binding = binding
        elif self._step_inputs is not None:
            self._step_inputs.write({io.input_ids: ids, io.attention_mask: mask})
        binding = self._decode_binding
        if self._step_inputs is None:
            binding.bind_cpu_input(io.input_ids, ids)
            binding.bind_cpu_input(io.attention_mask, mask)
        session.run_with_iobinding(binding)
        if self._logits_value is None:
            # Pin the logits buffer the first decode run allocated: replays write there.
            self._logits_value = binding.get_outputs()[-1]
            binding.bind_ortvalue_output(io.logits, self._logits_value)
        return self._last_row(self._logits_value)

    def _logits_buffer(self) -> Any:
        """A device buffer for the logits that replays write into, made before the first
        decode run: the WebGPU plugin refuses to capture into an output the run allocates.
        None where this onnxruntime cannot make device buffers from numpy (onnxruntime-webgpu
        1.27): the first decode run's own buffer is pinned instead."""
        io = self.package.io
        kind = next(o.type for o in self.handle.session.get_outputs() if o.name == io.logits)
        zeros = np.zeros((1, 1, self.package.vocab_size), dtype=_FLOATS[kind])
        return device_value(zeros, self.handle.device)

    def _bind_kv(self, binding: Any) -> None:
        assert self._kv is not None
        for name, value in self._kv.values.items():
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(self.presents[name], value)

    def _last_row(self, value: Any) -> np.ndarray:
        """Logits of the last position as a float32 [vocab] host array. WebGPU runs
        return before the device has finished: ``OrtValue.numpy()`` would wait for it
        holding Python's GIL (on lavapipe 10-20 s a token in which the studio's window
        and its Cancel froze), so a :class:`HostReader` waits inside a session run."""
        if self.handle.device != "webgpu" and value.element_type() != BF16_TYPE:
            array = value.numpy()  # numpy has no bfloat16: the reader casts those to fp32
        else:
            if self._reader is None:
                self._reader = HostReader(self.ep)
            array = self._reader.read(value)
        return np.asarray(array[0, -1], dtype=np.float32)


class HostReader:
    """Copies the last position of rank-3 device tensors ``[B, S, V]`` of one EP to the
    host inside a session run (a Slice, its output bound to the host), which onnxruntime
    runs with the GIL released; one session per dtype, made on first use. Only ``[B, 1,
    V]`` crosses to the host (a prefill's logits are S rows), and bfloat16, which numpy
    cannot hold, is cast to float32 on the device first."""

    def __init__(self, ep: str) -> None:
        self.ep = ep
        self._sessions: dict[int, Any] = {}

    def read(self, value: Any) -> np.ndarray:
        kind = value.element_type()
        if kind not in self._sessions:
            self._sessions[kind] = self._session(kind)
        session = self._sessions[kind]
        binding = session.io_binding()  # a binding keeps its output's first shape
        binding.bind_ortvalue_input("x", value)
        binding.bind_output("x_out", "cpu")
        session.run_with_iobinding(binding)
        return np.asarray(binding.get_outputs()[0].numpy())

    def _session(self, kind: int) -> Any:
        import tempfile

        from onnx import save

        model = _last_position_model(kind)
        with tempfile.TemporaryDirectory(prefix="es-reader-") as folder:
            path = os.path.join(folder, "reader.onnx")
            save(model, path)
            return create_session(path, self.ep, profile_first_run=False).session


def _last_position_model(kind: int) -> Any:
    """``x[:, -1:, :]`` of a rank-3 tensor of ONNX type ``kind``, as ``x_out`` (bfloat16
    cast to float32)."""
    from onnx import TensorProto, helper

    out = TensorProto.FLOAT if kind == BF16_TYPE else kind
    bounds = [
        helper.make_tensor(name, TensorProto.INT64, [1], [value])
        for name, value in (("start", -1), ("end", 2**63 - 1), ("axis", 1))
    ]
    sliced = "x_out" if out == kind else "last"
    nodes = [helper.make_node("Slice", ["x", "start", "end", "axis"], [sliced])]
    if out != kind:
        nodes.append(helper.make_node("Cast", ["last"], ["x_out"], to=out))
    graph = helper.make_graph(
        nodes,
        "last_position",
        [helper.make_tensor_value_info("x", kind, ["b", "s", "v"])],
        [helper.make_tensor_value_info("x_out", out, ["b", 1, "v"])],
        bounds,
    )
    # IR 10 / opset 21, as identity_model: onnxruntime-webgpu 1.27 refuses newer IR versions
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def greedy_tokens(
    package: str | os.PathLike[str], prompt: Sequence[int], new_tokens: int, **options: Any
) -> list[int]:
    """Convenience: greedy tokens of a package (options as in :class:`RunnerOptions`)."""
    runner = Runner(package, RunnerOptions(**options))
    return list(runner.generate(prompt, new_tokens).tokens)
