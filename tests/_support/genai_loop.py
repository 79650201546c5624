"""onnxruntime-genai's own greedy loop over a package folder, as an app drives it (no engine
code in between)."""

from __future__ import annotations

from pathlib import Path


def genai_greedy(package: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """The tokens genai generates greedily after ``prompt`` (``new_tokens`` of them)."""
    import onnxruntime_genai as og

    model = og.Model(str(package))
    params = og.GeneratorParams(model)
    params.set_search_options(
        do_sample=False, max_length=len(prompt) + new_tokens, min_length=len(prompt) + new_tokens
    )
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)][len(prompt) :]
