"""Execution-provider capabilities, as data.

Builders and the planner read these flags; they never branch on an EP's name. Adding an
EP is adding an entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.errors import OptionsError

WEBGPU_MAX_BUFFER_SIZE = 268_435_456
"""W3C WebGPU default ``maxBufferSize`` (256 MiB)."""
WEBGPU_MAX_STORAGE_BINDING_SIZE = 134_217_728
"""W3C WebGPU default ``maxStorageBufferBindingSize`` (128 MiB)."""

FUSED_OPS = (
    "GroupQueryAttention",
    "SkipSimplifiedLayerNormalization",
    "SimplifiedLayerNormalization",
    "RotaryEmbedding",
    "MatMulNBits",
    "GatherBlockQuantized",
)


@dataclass(frozen=True)
class EpCapabilities:
    """What one execution provider can run, and how a package for it should look."""

    name: str
    """Short name used on the command line: cpu, cuda, webgpu, dml, trt-rtx."""
    display_name: str
    ort_provider: str
    """onnxruntime's provider name, e.g. ``WebGpuExecutionProvider``."""
    genai_provider: str | None
    """The key under ``provider_options`` in genai_config (None for the CPU)."""
    fused_ops: frozenset[str]
    """com.microsoft / fused ops this EP implements."""
    float_dtypes: tuple[str, ...]
    """Activation dtypes a package may use on this EP, preferred first."""
    gqa_dtypes: frozenset[str]
    """Activation dtypes GroupQueryAttention supports here."""
    max_buffer_size: int | None = None
    """Largest single buffer (initializer) the EP can allocate; None = no practical limit."""
    max_storage_binding_size: int | None = None
    """Largest buffer one shader binding may see; None = no limit."""
    graph_capture: bool = False
    """The EP can capture and replay the decoder's compute graph."""
    share_buffer: bool = True
    """Past and present KV can share one preallocated buffer (required for capture)."""
    int4_accuracy_level: int = 4
    """MatMulNBits ``accuracy_level`` by default (4 = int8 activations where supported)."""
    provider_options: Mapping[str, str] = field(default_factory=dict)
    """Default provider options written into genai_config."""
    capture_option: str | None = None
    """The provider option that switches graph capture on (value "1"/"0"), in genai_config
    and in onnxruntime's Python API; None = no capture from Python."""
    io_device: str = "cpu"
    """onnxruntime's IOBinding device name for outputs kept on the device."""
    session_config_prefix: str | None = None
    """Provider options are given to onnxruntime's Python API as session config entries with
    this prefix instead of a provider-options dict (WebGPU's package ignores the dict)."""
    install_hint: str = ""
    """What to install when this onnxruntime does not offer the EP."""
    capture_needs_static_graph: bool = False
    """Under capture every node must stay on the device: no Shape, ConstantOfShape,
    int64 tensor Slice/Squeeze, If/Loop; shapes static except the sequence axes."""
    host_shape_inputs: bool = False
    """The EP's kernels read shape-like inputs in host memory (Reshape's shape, Slice's
    starts, Pad's pads, Clip's bounds, reduction axes, GroupQueryAttention's total length:
    :data:`engine.audit.HOST_READ_INPUTS`). One computed from a graph input's values (not
    through Shape) needs a copy to the host, which graph capture cannot replay; the audit
    reports each."""
    host_total_length: bool = False
    """GroupQueryAttention reads ``total_sequence_length`` on the host, so it is taken from
    the mask's shape (a shape subgraph, which onnxruntime keeps on the CPU with no copy)
    instead of its values. Computed on the device it needs a MemcpyToHost node, and
    onnxruntime refuses graph capture for a session with one ("all compute graph nodes have
    not been partitioned to the CUDAExecutionProvider", measured on the H200 with
    onnxruntime-gpu 1.31.1 and genai-cuda 0.18: every node was on CUDA, the copy was not)."""
    int64_on_device: bool = True
    """int64 elementwise ops (ReduceSum, Sub, Equal, Where) run on the device. False means
    mask arithmetic must be done in int32 to stay on the device."""
    explicit_attention_over_cache: bool = False
    """No GroupQueryAttention: K/V are written into static shared buffers with
    ScatterElements and attention is explicit, in fp32, over a sliding layer's window or a
    full layer's buffer (:mod:`engine.graph.static_attention`). For EPs whose GQA cannot be
    trusted under graph capture. WebGPU 1.27, measured on lavapipe with one-op models:
    ``local_window_size`` gives wrong outputs under capture, a static ``attention_bias`` is
    refused, KV-shared (empty or repeated keys) nodes fail to dispatch, fp16 attention keeps
    scores in fp16, fp32 prefill at head size 512 exceeds workgroup storage and the
    non-flash path refuses capture."""
    gqa_max_head_dim: int | None = None
    """Widest head GroupQueryAttention serves well here; attention kinds with wider heads
    (Gemma 4's 512-wide full layers) are lowered as ``explicit_attention_over_cache`` does,
    KV in the package's dtype, the other kinds keep GroupQueryAttention. None: no limit.
    onnxruntime-gpu 1.31.1's flash kernels stop at 256: a 512-wide GQA layer with one KV
    head runs cutlass' memory-efficient attention after two ``Ungroup`` kernels that copy K
    and V once per query head, whose cost grows with the buffer (E2B INT4 at decode on an
    H100, CUPTI: 232 us a token at max_length 1,032 and 486 us at 4,096, the package's
    default, for its 7 full layers; ``benchmarks/results/cuda_profile-2026-12-06b-*``)."""
    fuse_projections: bool = False
    """Sibling projections of one input run as one MatMul / MatMulNBits: gate and up, and
    (with ``explicit_attention_over_cache``) q, k and v. Fewer, larger kernels where
    per-node cost dominates (WebGPU)."""
    skip_kernel_norms: bool = False
    """The decoder's plain RMSNorms (over the hidden size, and the per-head q/k/v norms as
    rows ``[B, S * heads, D]``) run as SkipSimplifiedLayerNormalization with a zero skip (one
    ConstantOfShape per shape, shared by the layers; ``x + 0`` is ``x`` exactly).
    onnxruntime-gpu 1.31.1 on the H200 (CUPTI, E2B at decode): its Skip kernel takes 1.7 us
    where its RMSNormalization kernel takes 2.9 us."""
    packed_qkv: bool = False
    """A KV-owning layer projects q, k and v as one MatMul / MatMulNBits whose output
    GroupQueryAttention takes packed (its key and value inputs left out): one GEMV at decode
    where there were three, and no q/k/v norm kernels of their own where the model norms all
    three heads (Gemma 4: one norm and one Mul, :class:`~engine.graph.modules.HeadNorm`).
    Models that norm q and k but not v (Qwen3, Gemma 3) split the one projection into q, k
    and v for their norms and hand them over unpacked: GQA's own q/k-norm inputs would save
    the split and the norms, but the CPU kernel refuses them, and the CI runs every CUDA
    graph on the CPU EP."""
    split_k: Mapping[str, int] = field(default_factory=dict)
    """Float decoder linears ``x @ W`` as ``G`` partial products over slices of K, summed
    (activation dtype -> G; absent = one MatMul): W is stored [G, 1, K / G, N] (the bytes
    of [K, N]), x [B, S, K] read as [G, B, S, K / G] (a Transpose: prefill stays one GEMM
    per slice), one batched MatMul, one ReduceSum.
    onnxruntime-webgpu 1.27's MatMul keeps one workgroup per 32 output columns walking all
    of K, which leaves a decode step's [1, K] x [K, N] latency-bound: on the H200, E2B's
    [1536 -> 12288 -> 1536] MLP under capture costs 403 us as two fp16 MatMuls, 134 us
    split in 4 (fp32: 383 us, 100 us split in 16; benchmarks/device/webgpu_ops.py, whose
    split case reshapes x without the Transpose: the graph's adds one ~7 us kernel per
    linear at decode)."""
    host_ops: frozenset[str] = frozenset()
    """Ops this EP has no kernel for (they run on the CPU, which breaks capture)."""
    max_split_outputs: int | None = None
    """Most outputs one Split node may have (each is a shader binding); None = no limit.
    WebGPU: 7, the W3C default of 8 storage buffers per shader stage less the input
    (lavapipe grants 16: 15 outputs run, 16 fail to build the shader)."""
    int64_index_ops: frozenset[str] = frozenset()
    """Ops whose int64 inputs stay on the device where int64 arithmetic does not (the
    kernel only reads them as indices): RotaryEmbedding's position ids on WebGPU."""
    host_op_dtypes: frozenset[tuple[str, str]] = frozenset()
    """(op, data dtype) pairs this EP has no kernel for although the op has one for other
    dtypes, dtypes as ONNX names in lower case (``int32``, ``bool``, ``float``). Builders
    pick another dtype (:meth:`has_kernel`); the audit flags any that remain."""
    data_dependent_shapes: bool = False
    """Ops whose output shape depends on the data (``Unique``) run on the device and the
    package needs no static graph. Mixture-of-experts layers then gather each expert the
    router picked once for all tokens (at most ``min(tokens * top_k, experts)`` experts)
    instead of once per token and pick (``tokens * top_k`` copies, which grows with the
    prompt). Measured on the CPU EP only."""
    gbq_odd_4bit_blocks: bool = True
    """GatherBlockQuantized reads 4-bit rows with an odd number of blocks (whose packed
    zero points end in a padding nibble). onnxruntime-webgpu 1.27 refuses them at run time
    ("scales and zero_points must have the same shape"); its 8-bit rows and even block
    counts are exact."""
    genai_max_images: int | None = None
    """Images per prompt onnxruntime-genai 0.18 can encode with the vision session on this
    EP (None: no limit). Its Gemma 4 vision loop slices one ``image_features`` buffer per
    image by pointer arithmetic on the buffer's address; a WebGPU buffer is a handle, so a
    second image kills the process (SIGSEGV, measured on lavapipe)."""
    untested: str = ""
    """Why packages for this EP have never run on its hardware in this project (said
    wherever the EP is chosen: plan, build, the studio); empty where they were measured."""
    rms_norm_op: str = "RMSNormalization"
    """How RMSNorm is expressed: ``RMSNormalization`` (ONNX opset 23), the contrib
    ``SimplifiedLayerNormalization`` (faster on some EPs, but unknown to onnx.checker),
    or ``explicit`` (ReduceMean / Pow / Mul)."""

    def supports(self, op: str) -> bool:
        return op in self.fused_ops

    def even_gbq_blocks(self, bits: int | None) -> bool:
        """GatherBlockQuantized rows of ``bits`` need an even block count here (see
        :attr:`gbq_odd_4bit_blocks`)."""
        return bits == 4 and not self.gbq_odd_4bit_blocks

    def untested_note(self) -> str:
        """The sentence users see about an EP whose packages never ran on its hardware
        ("" for the others)."""
        if not self.untested:
            return ""
        return f"{self.display_name} packages are untested on real hardware: {self.untested}"

    def has_kernel(self, op: str, dtype: str) -> bool:
        """Whether ``op`` on ``dtype`` data (an ONNX type name, any case) runs on the EP."""
        return op not in self.host_ops and (op, dtype.lower()) not in self.host_op_dtypes

    @property
    def default_dtype(self) -> str:
        return self.float_dtypes[0]


_ALL_FUSED = frozenset(FUSED_OPS)

_REGISTRY: dict[str, EpCapabilities] = {
    caps.name: caps
    for caps in (
        EpCapabilities(
            name="cpu",
            display_name="CPU",
            ort_provider="CPUExecutionProvider",
            genai_provider=None,
            fused_ops=_ALL_FUSED,
            float_dtypes=("fp32", "fp16"),
            gqa_dtypes=frozenset({"fp32", "fp16"}),
            int4_accuracy_level=4,
            data_dependent_shapes=True,
        ),
        EpCapabilities(
            name="cuda",
            display_name="CUDA",
            ort_provider="CUDAExecutionProvider",
            genai_provider="cuda",
            fused_ops=_ALL_FUSED,
            float_dtypes=("fp16", "bf16", "fp32"),
            gqa_dtypes=frozenset({"fp16", "bf16"}),
            graph_capture=True,
            int4_accuracy_level=4,
            # TF32 off: the CUDA EP's default (use_tf32 1) rounds fp32 MatMul inputs to 10-bit
            # mantissas; on the H200 an fp32 E2B package then missed transformers' fp32 logits
            # by 0.93 at the first step (top-1 20 of 65), and with it off by 0.019 (17 of 17;
            # benchmarks/results/cuda_parity-2026-12-02-*.json). fp16 / bf16 MatMuls are not
            # affected; the fp32 islands of those packages are then exact too.
            provider_options={"enable_cuda_graph": "0", "use_tf32": "0"},
            capture_option="enable_cuda_graph",
            host_shape_inputs=True,
            host_total_length=True,
            gqa_max_head_dim=256,
            packed_qkv=True,
            skip_kernel_norms=True,
            io_device="cuda",
            install_hint="install onnxruntime-gpu instead of onnxruntime (1.31 is a CUDA 13 build)",
        ),
        EpCapabilities(
            name="webgpu",
            display_name="WebGPU",
            ort_provider="WebGpuExecutionProvider",
            genai_provider="webgpu",
            fused_ops=_ALL_FUSED,
            float_dtypes=("fp16", "fp32"),
            gqa_dtypes=frozenset({"fp16", "fp32"}),
            max_buffer_size=WEBGPU_MAX_BUFFER_SIZE,
            max_storage_binding_size=WEBGPU_MAX_STORAGE_BINDING_SIZE,
            graph_capture=True,
            int4_accuracy_level=4,
            provider_options={"validationMode": "disabled"},
            capture_option="enableGraphCapture",
            capture_needs_static_graph=True,
            int64_on_device=False,
            explicit_attention_over_cache=True,
            fuse_projections=True,
            split_k={"fp16": 4, "fp32": 16},
            max_split_outputs=7,
            int64_index_ops=frozenset({"RotaryEmbedding"}),
            # Measured on onnxruntime-webgpu 1.27 (one-op models at opset 23, CPU fallback
            # disabled: tests/webgpu/op_kernels.py; Max / Min for float, float16 and int32).
            # Sin and Cos have kernels up to opset 21 only, yet are not listed: our graphs
            # compute them from constants alone, which onnxruntime folds at load
            # (engine/graph/axial_rope.py avoids them on run-time positions).
            host_ops=frozenset(
                {
                    "ConstantOfShape",
                    "Trilu",
                    "Attention",
                    "NonZero",
                    "Compress",
                    "Max",
                    "Min",
                    "Or",
                    "Xor",
                }
            ),
            # int64 is covered by ``int64_on_device``; float32 CumSum, Slice and Clip and
            # int32 Equal run on the device.
            host_op_dtypes=frozenset(
                {
                    ("CumSum", "int32"),
                    ("Slice", "int32"),
                    ("Slice", "bool"),
                    ("Clip", "int32"),
                    ("Equal", "bool"),
                }
            ),
            gbq_odd_4bit_blocks=False,
            genai_max_images=1,
            io_device="webgpu",
            session_config_prefix="ep.webgpuexecutionprovider.",
            install_hint=(
                'install the WebGPU plugin EP (pip install "export-studio[webgpu]", or '
                "onnxruntime-ep-webgpu); without a GPU it needs Mesa's lavapipe (README: "
                "WebGPU runtime)"
            ),
        ),
        EpCapabilities(
            name="dml",
            display_name="DirectML",
            ort_provider="DmlExecutionProvider",
            genai_provider="dml",
            fused_ops=_ALL_FUSED - {"GatherBlockQuantized"},
            float_dtypes=("fp16", "fp32"),
            gqa_dtypes=frozenset({"fp16"}),
            max_buffer_size=4 * 1024**3,
            graph_capture=True,
            int4_accuracy_level=4,
            host_total_length=True,
            io_device="dml",
            install_hint="install onnxruntime-directml on Windows",
            untested=(
                "DirectML runs on Windows only, and no Windows machine was available; the "
                "packages are built and checked, never run on DirectML"
            ),
        ),
        EpCapabilities(
            name="trt-rtx",
            display_name="TensorRT-RTX",
            ort_provider="NvTensorRTRTXExecutionProvider",
            genai_provider="NvTensorRtRtx",
            fused_ops=frozenset({"GroupQueryAttention", "MatMulNBits"}),
            float_dtypes=("fp16", "bf16"),
            gqa_dtypes=frozenset({"fp16", "bf16"}),
            graph_capture=True,
            int4_accuracy_level=4,
            provider_options={"enable_cuda_graph": "0"},
            capture_option="enable_cuda_graph",
            host_total_length=True,
            io_device="cuda",
            install_hint="install onnxruntime with the TensorRT-RTX EP",
            # onnxruntime-ep-nv-tensorrt-rtx-cu13 0.5.0 registers beside onnxruntime 1.32 on
            # the lent H200 and lists no device there (shared/device/README.md).
            untested=(
                "TensorRT for RTX needs a GeForce RTX or RTX PRO GPU and none was available "
                "(it offers no device on an H200); the packages are built and checked, never "
                "run on TensorRT-RTX"
            ),
        ),
    )
}


def list_eps() -> list[str]:
    """Names of the known execution providers."""
    return list(_REGISTRY)


def get_caps(name: str) -> EpCapabilities:
    """Capabilities of one EP by its short name."""
    key = name.strip().lower()
    aliases = {
        "directml": "dml",
        "trt": "trt-rtx",
        "tensorrt-rtx": "trt-rtx",
        "nvtensorrtrtx": "trt-rtx",
    }
    key = aliases.get(key, key)
    if key not in _REGISTRY:
        raise OptionsError(
            f"unknown execution provider '{name}'; choose one of: {', '.join(_REGISTRY)}"
        )
    return _REGISTRY[key]
