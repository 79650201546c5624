"""Model specs: what the planner and builders need to know about a model, as frozen
dataclasses. Each model family reads them from Hugging Face ``config.json`` files
(:func:`engine.models.spec_from_config`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

AttentionKind = Literal["sliding", "full"]


RopeKind = Literal["default", "proportional", "linear", "llama3", "yarn", "longrope"]
ROPE_KINDS: tuple[RopeKind, ...] = (
    "default",
    "proportional",
    "linear",
    "llama3",
    "yarn",
    "longrope",
)


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding of one attention kind, as transformers' ``rope_parameters`` say.

    ``proportional`` (Gemma 4's full layers) rotates only the first
    ``partial_rotary_factor * head_dim / 2`` frequency pairs of a ``rotate_half`` layout and
    leaves the rest with frequency 0, which keeps the cos/sin caches full-width
    (head_dim / 2). ``linear`` divides every frequency by ``factor``; ``llama3`` divides
    the low frequencies by it and blends the middle band (``low_freq_factor``,
    ``high_freq_factor`` over ``original_max_position_embeddings``); ``yarn`` blends
    interpolated and extrapolated frequencies over a ramp (``beta_fast``, ``beta_slow``)
    and scales cos and sin by :attr:`attention_scaling`; ``longrope`` divides each
    frequency by its own factor, ``short_factor`` up to ``original_max_position_embeddings``
    tokens and ``long_factor`` beyond (:meth:`switches`), and scales cos and sin too.

    A ``partial_rotary_factor`` below 1 on the other kinds rotates only the first
    :meth:`rotary_dim` channels of each head (transformers' ``q[..., :rotary_dim]``, Phi-4).
    The graphs lower one layout, proportional's (pairs ``i`` and ``i + head_dim / 2``,
    the pairs that do not rotate at frequency 0), so those heads' channels are reordered
    in the q/k projections' rows (:meth:`channel_order`): ``q . k`` is the same sum.
    """

    kind: RopeKind
    theta: float
    partial_rotary_factor: float = 1.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    """yarn's and longrope's factor on cos and sin; None = transformers' default from
    ``factor``."""
    short_factor: tuple[float, ...] = ()
    """longrope: the divisor of each rotated frequency up to the original length."""
    long_factor: tuple[float, ...] = ()
    """longrope: the divisors beyond it."""

    def rotary_dim(self, head_dim: int) -> int:
        """The channels of a head that rotate in the checkpoint's layout: all of them for
        proportional RoPE (it zeroes frequencies instead), else transformers'
        ``int(head_dim * partial_rotary_factor)``."""
        if self.kind == "proportional":
            return head_dim
        return int(head_dim * self.partial_rotary_factor)

    def inv_freq(self, head_dim: int, *, long: bool = False) -> np.ndarray:
        """Inverse frequencies, float64, of length head_dim / 2, as transformers computes
        them, in the graphs' layout: the pairs that do not rotate last, at frequency 0.
        ``long``: longrope's set beyond the original length."""
        if self.kind == "proportional":
            rope_angles = int(self.partial_rotary_factor * head_dim // 2)
            exponents = np.arange(0, 2 * rope_angles, 2, dtype=np.float64) / head_dim
            rotated = 1.0 / (self.theta**exponents)
            zeros = np.zeros(head_dim // 2 - rope_angles, dtype=np.float64)
            return np.concatenate([rotated, zeros]) / self.factor
        dim = self.rotary_dim(head_dim)
        exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
        inv = 1.0 / (self.theta**exponents)
        if self.kind == "linear":
            inv = inv / self.factor
        elif self.kind == "llama3":
            inv = self._llama3(inv)
        elif self.kind == "yarn":
            inv = self._yarn(inv, dim)
        elif self.kind == "longrope":
            factors = self.long_factor if long else self.short_factor
            if len(factors) != dim // 2:
                raise ValueError(
                    f"longrope needs {dim // 2} factors per set for head size {head_dim}, "
                    f"got {len(factors)}"
                )
            inv = inv / np.asarray(factors, dtype=np.float64)
        return np.concatenate([inv, np.zeros(head_dim // 2 - dim // 2, dtype=np.float64)])

    def switches(self, max_length: int) -> bool:
        """A cache of ``max_length`` positions needs longrope's second set: the sequence
        can grow past the original length, where every new token takes ``long_factor``
        (transformers: ``max(position_ids) + 1 > original_max_position_embeddings``)."""
        return self.kind == "longrope" and max_length > self._original_length()

    def channel_order(self, head_dim: int) -> tuple[int, ...] | None:
        """For a head that rotates only its first :meth:`rotary_dim` channels: the
        checkpoint's channel at each position of the graphs' layout (rotate_half pairs
        ``i`` and ``i + head_dim / 2``, the channels that pass through in the pairs after
        the rotated ones). None when the layouts already agree."""
        dim = self.rotary_dim(head_dim)
        if dim == head_dim:
            return None
        half, rotated = head_dim // 2, dim // 2
        passed = list(range(dim, head_dim))
        first = list(range(rotated)) + passed[: half - rotated]
        second = list(range(rotated, dim)) + passed[half - rotated :]
        return tuple(first + second)

    def _original_length(self) -> int:
        if self.original_max_position_embeddings is None:
            raise ValueError(f"{self.kind} RoPE needs original_max_position_embeddings")
        return self.original_max_position_embeddings

    def _llama3(self, inv: np.ndarray) -> np.ndarray:
        old = self._original_length()
        wavelen = 2 * math.pi / inv
        low_wavelen, high_wavelen = old / self.low_freq_factor, old / self.high_freq_factor
        scaled = np.where(wavelen > low_wavelen, inv / self.factor, inv)
        smooth = (old / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled)

    def _yarn(self, inv: np.ndarray, dim: int) -> np.ndarray:
        old = self._original_length()

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(self.theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as transformers: no division by zero
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolated = 1 - ramp
        return (inv / self.factor) * (1 - extrapolated) + inv * extrapolated

    @property
    def attention_scaling(self) -> float:
        """The factor on cos and sin (yarn's and longrope's ``attention_factor``; 1 for the
        other kinds)."""
        if self.kind not in ("yarn", "longrope"):
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.factor <= 1:
            return 1.0
        if self.kind == "yarn":
            return 0.1 * math.log(self.factor) + 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self._original_length()))

    def rotated_pairs(self, head_dim: int) -> int:
        """Frequency pairs that rotate (the leading ones); the rest have frequency 0, so
        their cos is 1 and their sin 0 at every position."""
        if self.kind != "proportional":
            return self.rotary_dim(head_dim) // 2
        return int(self.partial_rotary_factor * head_dim // 2)

    def cos_sin(self, head_dim: int, max_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin caches of shape [max_positions, head_dim / 2], float32.

        transformers computes the angles in float32 (positions times float32 inverse
        frequencies); doing the same keeps exported logits bit-close to its forward.
        """
        inv = self.inv_freq(head_dim).astype(np.float32)
        positions = np.arange(max_positions, dtype=np.float32)[:, None]
        angles = positions * inv[None, :]
        return self.scaled(np.cos(angles), head_dim), self.scaled(np.sin(angles), head_dim)

    def scaled(self, table: np.ndarray, head_dim: int) -> np.ndarray:
        """A cos or sin table (float32) times :attr:`attention_scaling` in the columns of
        the pairs that rotate; the channels that pass through stay as they are."""
        scale = self.attention_scaling
        table = table.astype(np.float32)
        if scale == 1.0:
            return table
        table = table.copy()
        rotated = self.rotated_pairs(head_dim)
        table[:, :rotated] = (table[:, :rotated] * np.float32(scale)).astype(np.float32)
        return table


@dataclass(frozen=True)
class MoeSpec:
    """The mixture-of-experts block of a layer (``enable_moe_block``), run beside its MLP.

    A router picks ``top_k`` of ``num_experts`` experts per token; each expert is a gated
    GELU MLP of width ``intermediate_size`` (``moe_intermediate_size``) whose gate and up
    projections are stored fused as ``gate_up_proj`` [E, 2 * I, H].
    """

    num_experts: int
    top_k: int
    intermediate_size: int


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer."""

    index: int
    attention: AttentionKind
    head_dim: int
    num_kv_heads: int
    intermediate_size: int
    kv_source: int
    """Index of the layer whose keys and values this layer attends to (itself if not shared)."""
    k_eq_v: bool = False
    """Values are the keys before their norms (``attention_k_eq_v`` on full layers)."""
    moe: MoeSpec | None = None
    """The layer's mixture-of-experts block, or None for a dense layer."""
    query_scale: float | None = None
    """The factor on ``q . k`` before the softmax; None for the usual ``head_dim ** -0.5``
    (Gemma 4 uses 1.0: its q and k are RMS-normed)."""
    rope: bool = True
    """Queries and keys are rotated (False: SmolLM3's no-RoPE layers, ``no_rope_layers``)."""

    @property
    def owns_kv(self) -> bool:
        return self.kv_source == self.index

    @property
    def attention_scale(self) -> float:
        """The factor attention applies to ``q . k``."""
        return self.head_dim**-0.5 if self.query_scale is None else self.query_scale


@dataclass(frozen=True)
class VisionSpec:
    """The vision tower of a multimodal Gemma 4 checkpoint (``vision_config``)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    activation: str
    rms_norm_eps: float
    patch_size: int
    pooling_kernel_size: int
    position_embedding_size: int
    rope_theta: float
    use_clipped_linears: bool
    standardize: bool
    max_soft_tokens: int
    """Image tokens per image at most (the processor's budget; sizes a static graph)."""

    @property
    def patch_pixels(self) -> int:
        return 3 * self.patch_size**2


@dataclass(frozen=True)
class AudioSpec:
    """The audio tower (a conformer) of a multimodal Gemma 4 checkpoint (``audio_config``)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    activation: str
    subsampling_conv_channels: tuple[int, int]
    conv_kernel_size: int
    residual_weight: float
    chunk_size: int
    context_left: int
    context_right: int
    logit_cap: float
    invalid_logits_value: float
    use_clipped_linears: bool
    rms_norm_eps: float
    gradient_clipping: float
    output_proj_dims: int
    feature_size: int = 128
    """Mel bins per frame (the feature extractor's ``feature_size``)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class MultimodalTokens:
    """Token ids a multimodal prompt uses around and inside image / audio spans."""

    image_token_id: int
    audio_token_id: int
    boi_token_id: int | None = None
    eoi_token_id: int | None = None
    boa_token_id: int | None = None
    eoa_token_id: int | None = None
    video_token_id: int | None = None

    @property
    def placeholders(self) -> tuple[int, ...]:
        """Ids that stand for a soft token (image, audio, video): never embedded as text."""
        ids = (self.image_token_id, self.audio_token_id, self.video_token_id)
        return tuple(i for i in ids if i is not None)


@dataclass(frozen=True)
class ModelSpec:
    """Everything the planner and builders need to know about a decoder-only language
    model (plus the multimodal towers a checkpoint has), whatever its family: each family's
    reader (``engine/models/<family>/config.py``) fills it from ``config.json``.

    The fields a family may leave at their defaults describe what most decoders do not
    have: per-layer embeddings (``ple_dim`` 0), a logit softcap, q/k/v norms, biases, towers.
    """

    name: str
    model_type: str
    """The text model's type, e.g. ``gemma4_text`` or ``qwen3``: genai_config's
    ``model.type`` for a text package."""
    source_model_type: str
    """The checkpoint's top-level ``model_type`` (``gemma4`` for multimodal checkpoints)."""
    vocab_size: int
    hidden_size: int
    num_attention_heads: int
    layers: tuple[LayerSpec, ...]
    rope: Mapping[AttentionKind, RopeSpec]
    sliding_window: int
    max_position_embeddings: int
    rms_norm_eps: float
    hidden_activation: str
    final_logit_softcapping: float | None
    tie_word_embeddings: bool
    ple_dim: int
    """``hidden_size_per_layer_input``; 0 when the model has no per-layer embeddings."""
    ple_vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    weight_prefix: str
    """Prefix of the text decoder's tensors in the checkpoint (``model.`` or
    ``model.language_model.``)."""
    source_dtype: str = "float32"
    bidirectional_images: bool = False
    """Image tokens attend to each other both ways on sliding layers
    (``use_bidirectional_attention: "vision"``, the 26B-A4B and 31B checkpoints)."""
    vision: VisionSpec | None = None
    audio: AudioSpec | None = None
    tokens: MultimodalTokens | None = None
    qk_norm: bool = False
    """Each head's query and key go through an RMSNorm with a learnt scale before RoPE
    (``q_norm`` / ``k_norm``: Qwen3, Gemma 3 and 4)."""
    value_norm: bool = False
    """Each head's value goes through a scale-free RMSNorm (Gemma 4's ``v_norm``)."""
    qkv_bias: bool = False
    """The q, k and v projections have biases (Qwen2, ``attention_bias``)."""
    o_bias: bool = False
    """The output projection has a bias (Llama's ``attention_bias`` sets both)."""
    stored_fused: bool = False
    """The checkpoint stores q/k/v as one ``qkv_proj`` and gate/up as one ``gate_up_proj``
    (Phi-3); the graph reads them as they are and splits the outputs."""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def towers(self) -> tuple[str, ...]:
        """The multimodal towers the checkpoint has: ``vision`` and / or ``audio``."""
        return tuple(
            name for name, tower in (("vision", self.vision), ("audio", self.audio)) if tower
        )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def kv_layers(self) -> tuple[LayerSpec, ...]:
        """Layers that own a KV cache, in order; their position is the cache index."""
        return tuple(layer for layer in self.layers if layer.owns_kv)

    @property
    def num_kv_shared_layers(self) -> int:
        return sum(1 for layer in self.layers if not layer.owns_kv)

    @property
    def has_ple(self) -> bool:
        return self.ple_dim > 0

    def kv_cache_index(self, layer_index: int) -> int:
        """Cache slot (past_key_values.N) of the layer that owns layer_index's KV."""
        source = self.layers[layer_index].kv_source
        return [layer.index for layer in self.kv_layers].index(source)

    def summary(self) -> dict[str, Any]:
        """A short, JSON-friendly description for the CLI's ``info`` and the app."""
        kinds = [layer.attention for layer in self.layers]
        return {
            "name": self.name,
            "model_type": self.model_type,
            "source_model_type": self.source_model_type,
            "towers": list(self.towers),
            "layers": self.num_layers,
            "sliding_layers": kinds.count("sliding"),
            "full_layers": kinds.count("full"),
            "kv_cache_layers": len(self.kv_layers),
            "kv_shared_layers": self.num_kv_shared_layers,
            "hidden_size": self.hidden_size,
            "attention_heads": self.num_attention_heads,
            "head_dim": {k: self._first(k, "head_dim") for k in ("sliding", "full")},
            "kv_heads": {k: self._first(k, "num_kv_heads") for k in ("sliding", "full")},
            "intermediate_sizes": sorted({layer.intermediate_size for layer in self.layers}),
            "experts": self._moe_summary(),
            "vocab_size": self.vocab_size,
            "per_layer_embedding_dim": self.ple_dim,
            "sliding_window": self.sliding_window if "sliding" in kinds else None,
            "max_position_embeddings": self.max_position_embeddings,
            "final_logit_softcapping": self.final_logit_softcapping,
            "tie_word_embeddings": self.tie_word_embeddings,
            "source_dtype": self.source_dtype,
        }

    def _moe_summary(self) -> dict[str, int] | None:
        moe = next((layer.moe for layer in self.layers if layer.moe is not None), None)
        if moe is None:
            return None
        return {
            "moe_layers": sum(1 for layer in self.layers if layer.moe is not None),
            "num_experts": moe.num_experts,
            "top_k": moe.top_k,
            "intermediate_size": moe.intermediate_size,
        }

    def _first(self, kind: AttentionKind, attr: str) -> int | None:
        for layer in self.layers:
            if layer.attention == kind:
                return int(getattr(layer, attr))
        return None
