"""The same generation through onnxruntime-genai, for side-by-side numbers.

onnxruntime-genai reads genai_config.json itself; this wrapper only overrides the EP and
the graph-capture provider option through ``og.Config`` (the file on disk is untouched),
and times the prefill and each decode step the way :class:`engine.runtime.runner.Runner`
does. genai does not report node placement, so the provider is the one requested.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.caps import get_caps
from engine.errors import (
    EngineError,
    OptionsError,
    PackageError,
    RuntimeUnavailableError,
    option,
)
from engine.progress import CancelToken
from engine.runtime.generation import Generation
from engine.runtime.limits import check_threads
from engine.runtime.media import MediaPrompt, check_processed_length
from engine.runtime.package import Package, open_package
from engine.runtime.plugins import adapter_notices_dropped, register_genai
from engine.runtime.sampling import GREEDY, Sampler
from engine.runtime.session import one_line, require_provider
from engine.runtime.session_files import load_failure


def import_genai() -> Any:
    """The onnxruntime_genai module, or a clear error when it is missing."""
    try:
        import onnxruntime_genai as og
    except ImportError as exc:
        raise RuntimeUnavailableError(
            "onnxruntime-genai is not installed; pip install onnxruntime-genai "
            "(on top of onnxruntime-webgpu: pip install --no-deps onnxruntime-genai)"
        ) from exc
    return og


class GenaiRunner:
    """A package loaded by onnxruntime-genai.

    Args:
        package: A package folder or an opened :class:`Package`.
        ep: Short EP name; None = the package's EP.
        graph_capture: Force the capture provider option on or off; None keeps the
            package's genai_config setting.
        threads: intra-op threads (None: genai's default, which may differ from
            onnxruntime's; give both runtimes the same number to compare them).

    Raises:
        RuntimeUnavailableError: onnxruntime-genai or the EP is missing, or it refused
            the package.
    """

    def __init__(
        self,
        package: Package | str | os.PathLike[str],
        *,
        ep: str | None = None,
        graph_capture: bool | None = None,
        threads: int | None = None,
    ) -> None:
        check_threads(threads)
        og = import_genai()
        self.package = package if isinstance(package, Package) else open_package(package)
        self.ep = ep or self.package.ep
        caps = require_provider(self.ep)
        plugin = register_genai(caps.ort_provider)  # a plugin EP (WebGPU's) is given to genai
        provider = caps.genai_provider
        try:  # genai parses genai_config.json itself and raises RuntimeError for any problem
            config = og.Config(str(self.package.path))
            if threads:
                options = {"session_options": {"intra_op_num_threads": threads}}
                config.overlay(json.dumps({"model": {"decoder": options}}))
            config.clear_providers()
            if provider is not None:
                config.append_provider(provider)
                for key, value in self._provider_options(provider).items():
                    config.set_provider_option(provider, key, value)
        except RuntimeError as exc:
            raise PackageError(
                f"onnxruntime-genai cannot read {self.package.path / 'genai_config.json'}: "
                f"{one_line(exc)}; fix the file or rebuild the package"
            ) from exc
        if graph_capture:
            if caps.capture_option is None or provider is None:
                raise OptionsError(
                    f"{caps.display_name} has no graph capture; "
                    f"use {option('graph_capture', 'off')}"
                )
            if not self.package.share_buffer:
                raise OptionsError(
                    "graph capture needs past_present_share_buffer (a GroupQueryAttention "
                    f"package); use {option('graph_capture', 'off')}"
                )
        if provider is not None and caps.capture_option is not None:
            capture = self.package.graph_capture if graph_capture is None else graph_capture
            config.set_provider_option(provider, caps.capture_option, "1" if capture else "0")
        self.graph_capture = bool(
            self.package.graph_capture if graph_capture is None else graph_capture
        )
        self.provider = caps.ort_provider
        started = time.perf_counter()
        try:
            with adapter_notices_dropped() if plugin else contextlib.nullcontext():
                self.model = og.Model(config)
        except Exception as exc:  # genai raises RuntimeError for everything
            short = load_failure(self.package.path, "a session", str(exc))
            if short is not None:
                raise short from exc
            raise RuntimeUnavailableError(
                f"onnxruntime-genai could not load {self.package.path} on "
                f"{get_caps(self.ep).display_name}: {one_line(exc)}"
            ) from exc
        self.load_seconds = time.perf_counter() - started
        self._og = og

    def _provider_options(self, provider: str) -> dict[str, str]:
        from engine.runtime.package import session_provider_options

        decoder = self.package.config.get("model", {}).get("decoder", {})
        return session_provider_options(decoder, provider)

    def generate(
        self,
        prompt: Sequence[int],
        new_tokens: int,
        *,
        sampler: Sampler = GREEDY,
        keep_logits: bool = False,
        stop_at_eos: bool = False,
        cancel: CancelToken | None = None,
    ) -> Generation:
        """Prefill ``prompt`` and produce ``new_tokens`` tokens (see ``Runner.generate``)."""
        if not prompt or new_tokens < 1:
            raise OptionsError("give a non-empty prompt and at least one new token")
        og = self._og
        params = og.GeneratorParams(self.model)
        total = len(prompt) + new_tokens
        search: dict[str, Any] = {"max_length": total, "do_sample": not sampler.greedy}
        if not stop_at_eos:
            search["min_length"] = total
        if not sampler.greedy:
            search.update(
                temperature=sampler.temperature,
                top_k=sampler.top_k or self.package.vocab_size,
                top_p=sampler.top_p,
                random_seed=sampler.seed,
            )
        params.set_search_options(**search)
        try:
            return self._loop(
                og.Generator(self.model, params),
                prompt,
                new_tokens,
                keep_logits=keep_logits,
                stop_at_eos=stop_at_eos,
                cancel=cancel,
            )
        except EngineError:
            raise
        except Exception as exc:  # genai raises RuntimeError for everything
            raise RuntimeUnavailableError(
                f"onnxruntime-genai failed running {self.package.path.name} on {self.provider}"
                f"{' under graph capture' if self.graph_capture else ''}: {one_line(exc)}"
            ) from exc

    def generate_media(
        self,
        media: MediaPrompt,
        new_tokens: int,
        *,
        keep_logits: bool = False,
        stop_at_eos: bool = False,
        cancel: CancelToken | None = None,
    ) -> Generation:
        """A prompt with images and / or an audio clip through genai's own processors
        (``create_multimodal_processor``): the first token's time includes decoding the
        files, the vision / speech sessions and the prefill."""
        media.check(self.package)
        og = self._og
        try:
            started = time.perf_counter()
            inputs = media.process(og, self.model)
            prompt_length = int(MediaPrompt.array(inputs["input_ids"]).shape[-1])
            check_processed_length(
                self.package, media, prompt_length, new_tokens, option("new_tokens")
            )
            params = og.GeneratorParams(self.model)
            total = prompt_length + new_tokens
            search: dict[str, Any] = {"max_length": total, "do_sample": False}
            if not stop_at_eos:
                search["min_length"] = total
            params.set_search_options(**search)
            generator = og.Generator(self.model, params)

            def feed() -> int:
                generator.set_inputs(inputs)
                return prompt_length

            return self._loop(
                generator,
                feed,
                new_tokens,
                keep_logits=keep_logits,
                stop_at_eos=stop_at_eos,
                cancel=cancel,
                started=started,
            )
        except EngineError:
            raise
        except Exception as exc:  # genai raises RuntimeError for everything
            raise RuntimeUnavailableError(
                f"onnxruntime-genai could not run the prompt with {media.describe()} "
                f"({media.files()}) on {self.package.path.name}: {one_line(exc)}"
            ) from exc

    def _loop(
        self,
        generator: Any,
        prompt: Sequence[int] | Callable[[], int],
        new_tokens: int,
        *,
        keep_logits: bool,
        stop_at_eos: bool,
        cancel: CancelToken | None,
        started: float | None = None,
    ) -> Generation:
        """Feed the prompt (token ids, or a callable that sets processed inputs and returns
        their length), then time each step."""
        tokens: list[int] = []
        argmax: list[int] = []
        kept: list[np.ndarray] = []
        steps: list[float] = []
        started = time.perf_counter() if started is None else started
        if callable(prompt):
            prompt_length = prompt()
        else:
            generator.append_tokens(np.asarray(prompt, dtype=np.int32))
            prompt_length = len(prompt)
        prefill = time.perf_counter() - started
        first = 0.0
        for i in range(new_tokens):
            if generator.is_done():
                break
            if cancel is not None:
                cancel.raise_if_cancelled()
            step_start = time.perf_counter()
            # genai runs the model lazily: on the previous token when logits are read or
            # the next token is chosen, so both stay inside the step's time.
            if keep_logits:
                row = np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1)
                kept.append(row)
                argmax.append(int(np.argmax(row)))
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
            elapsed = time.perf_counter() - step_start
            if i == 0:
                first = prefill + elapsed
            else:
                steps.append(elapsed)
            if stop_at_eos and tokens[-1] in self.package.eos_token_ids:
                break
        eos = bool(tokens) and stop_at_eos and tokens[-1] in self.package.eos_token_ids
        return Generation(
            prompt_length=prompt_length,
            tokens=tuple(tokens),
            argmax=tuple(argmax),
            logits=tuple(kept),
            prefill_seconds=prefill,
            first_token_seconds=first,
            step_seconds=tuple(steps),
            stopped_at_eos=eos,
        )
