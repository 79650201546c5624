"""Modules: a model written once as a tree whose attribute paths are its weights' names.

A model family describes each session as a tree of :class:`Module` objects, the way the
checkpoint nests them (``layers.0.self_attn.q_proj``). The same tree serves two stages:
the planner walks it for every weight's name, shape and role without building a graph
(:func:`logical_weights`), and the builder calls the modules, which look their weights up
in the plan by those names. A name is written once, as an attribute.

Checkpoint keys follow the same paths under a prefix that a subtree can change
(:meth:`Module.at`): the text decoder reads ``model.language_model.*`` while its LM head
reads ``lm_head.*``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import onnx_ir as ir

from engine.graph.components import activation, embedding, linear, rms_norm
from engine.graph.context import BuildContext
from engine.logical import LogicalWeight, Role, RopeTable, RowOrder


@dataclass(frozen=True)
class Param:
    """A weight declared by a module; its name comes from the attribute that holds it."""

    shape: tuple[int, ...]
    role: Role
    scale: float | None = None
    computed: RopeTable | None = None
    """How the engine computes the tensor instead of reading it (see LogicalWeight)."""
    fill: float | None = None
    """What a random-weights package holds instead of random draws (see LogicalWeight)."""
    name: str = ""
    """Full name inside the session, set when the tree is bound."""
    source: str | None = None
    """Checkpoint key, set when the tree is bound (None for computed tensors)."""
    parts: tuple[LogicalWeight, ...] = ()
    """A fused weight's parts (see :class:`LogicalWeight`), their names and sources written
    relative to the fusing module's parent (its siblings' paths) until bound."""
    dtype: str | None = None
    """A dtype the tensor keeps whatever the package's (see :class:`LogicalWeight`)."""
    offset: float = 0.0
    """Added to the checkpoint's values as they are read (see :class:`LogicalWeight`)."""
    row_order: RowOrder | None = None
    """The checkpoint's rows reordered as they are read (see :class:`LogicalWeight`)."""

    @property
    def logical(self) -> LogicalWeight:
        return LogicalWeight(
            self.name,
            self.shape,
            self.role,
            computed=self.computed,
            scale=self.scale,
            source=None if self.computed or self.parts else self.source,
            fill=self.fill,
            parts=self.parts,
            dtype=self.dtype,
            offset=self.offset,
            row_order=self.row_order,
        )


class Module:
    """A node of a session's weight tree.

    Subclasses assign :class:`Param`, :class:`Module` and lists of modules as attributes
    in ``__init__``; :meth:`bind` names them after their attribute paths.
    """

    _source_prefix: str | None = None
    """Checkpoint prefix this subtree reads from, replacing its parent's (see :meth:`at`)."""
    _inline: bool = False
    """Name this module's attributes at its parent's level (no segment of its own): for a
    group of tensors the checkpoint keeps loose beside their siblings."""

    def at(self, source_prefix: str) -> Module:
        """Read this subtree's weights from ``source_prefix`` + their path below it."""
        self._source_prefix = source_prefix
        return self

    def bind(self, name: str = "", source: str = "") -> Module:
        """Give every parameter below this module its full name and checkpoint key."""
        if self._source_prefix is not None:
            source = self._source_prefix
        for attr, child in list(vars(self).items()):
            if attr.startswith("_"):
                continue
            if isinstance(child, Param):
                bound = replace(child, name=name + attr, source=source + attr)
                if child.parts:
                    bound = replace(bound, parts=_bind_parts(child.parts, name, source))
                setattr(self, attr, bound)
            elif isinstance(child, Module) and child._inline:
                child.bind(name, source)
            elif isinstance(child, Module):
                child.bind(f"{name}{attr}.", f"{source}{attr}.")
            elif isinstance(child, list) and child and isinstance(child[0], Module):
                for i, item in enumerate(child):
                    item.bind(f"{name}{attr}.{i}.", f"{source}{attr}.{i}.")
        return self

    def map_params(self, change: Callable[[Param], Param]) -> Module:
        """Replace every parameter below this module by ``change(parameter)``."""
        for attr, child in list(vars(self).items()):
            if attr.startswith("_"):
                continue
            if isinstance(child, Param):
                setattr(self, attr, change(child))
            elif isinstance(child, Module):
                child.map_params(change)
            elif isinstance(child, list):
                for item in child:
                    if isinstance(item, Module):
                        item.map_params(change)
        return self

    def params(self) -> Iterator[Param]:
        """Every parameter below this module, in declaration order."""
        for attr, child in vars(self).items():
            if attr.startswith("_"):
                continue
            if isinstance(child, Param):
                yield child
            elif isinstance(child, Module):
                yield from child.params()
            elif isinstance(child, list):
                for item in child:
                    if isinstance(item, Module):
                        yield from item.params()


def _parent(prefix: str) -> str:
    """``a.b.c.`` -> ``a.b.``: the prefix of a module's parent."""
    head, _, _ = prefix.rstrip(".").rpartition(".")
    return f"{head}." if head else ""


def _bind_parts(
    parts: tuple[LogicalWeight, ...], name: str, source: str
) -> tuple[LogicalWeight, ...]:
    """Resolve parts written relative to the fusing module's parent (sibling paths)."""
    names, sources = _parent(name), _parent(source)
    return tuple(
        replace(
            p,
            name=names + p.name,
            source=None if p.source is None else sources + p.source,
        )
        for p in parts
    )


def logical_weights(root: Module) -> list[LogicalWeight]:
    """The planner's view of a bound tree: every weight, in declaration order."""
    return [p.logical for p in root.params()]


# ------------------------------------------------------------------------------ leaves


class Linear(Module):
    """``x @ W.T`` (+ bias) for a checkpoint weight W [out, in]."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = False) -> None:
        self.weight = Param((out_features, in_features), "linear")
        self.bias = Param((out_features,), "bias") if bias else None

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        out = linear(ctx, x, self.weight.name)
        if self.bias is not None:
            out = ctx.op.Add(out, ctx.param(self.bias.name))
        return out


class ClippableLinear(Module):
    """A bias-free linear between optional clamps of its input and output (the clip
    bounds are 0-d checkpoint tensors, ``-inf`` / ``inf`` when a model never set them)."""

    def __init__(self, in_features: int, out_features: int, *, clipped: bool) -> None:
        if clipped:
            self.input_min = Param((), "clip", fill=float("-inf"))
            self.input_max = Param((), "clip", fill=float("inf"))
            self.output_min = Param((), "clip", fill=float("-inf"))
            self.output_max = Param((), "clip", fill=float("inf"))
        self._clipped = clipped
        self.linear = Linear(in_features, out_features)

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        if not self._clipped:
            return self.linear(ctx, x)
        x = ctx.op.Clip(x, ctx.param(self.input_min.name), ctx.param(self.input_max.name))
        out = self.linear(ctx, x)
        return ctx.op.Clip(out, ctx.param(self.output_min.name), ctx.param(self.output_max.name))


class Embedding(Module):
    """A [rows, width] table looked up by id, its rows multiplied by ``scale``."""

    def __init__(
        self, rows: int, width: int, *, role: Role = "embedding", scale: float | None = None
    ) -> None:
        self.weight = Param((rows, width), role, scale=scale)

    def __call__(self, ctx: BuildContext, ids: ir.Value) -> ir.Value:
        return embedding(ctx, ids, self.weight.name)


class RMSNorm(Module):
    """RMSNorm over the last axis; ``scale=False`` is Gemma 4's parameterless norm.

    ``dtype`` keeps the scale (and the input the norm expects) in that float dtype whatever
    the package's: the fp32 attention core of a half-precision package.
    """

    def __init__(
        self,
        width: int,
        *,
        scale: bool = True,
        eps: float | None = None,
        dtype: str | None = None,
    ) -> None:
        self.width = width
        self.eps = eps
        self.dtype = dtype
        self.weight = Param((width,), "norm", dtype=dtype) if scale else None

    def __call__(self, ctx: BuildContext, x: ir.Value, zeros: ir.Value | None = None) -> ir.Value:
        """``zeros``: as :func:`~engine.graph.components.rms_norm`'s."""
        name = self.weight.name if self.weight is not None else None
        return rms_norm(ctx, x, name, self.width, eps=self.eps, dtype=self.dtype, zeros=zeros)


class HeadNorm(Module):
    """RMSNorm over the last axis of ``[..., heads, D]`` whose scale differs per group of
    heads: Gemma 4's q_norm, k_norm and scale-free value norm as one norm and one Mul by a
    ``[heads, D]`` table, which the planner reads part by part from the checkpoint's
    ``[D]`` scales (a group without a scale holds ones).

    Args:
        width: D.
        groups: ``(sibling norm name or None, head count)`` in head order.
        dtype: As :class:`RMSNorm`.
    """

    def __init__(
        self, width: int, groups: list[tuple[str | None, int]], *, dtype: str | None = None
    ) -> None:
        self.width = width
        self.dtype = dtype
        parts = tuple(
            LogicalWeight(
                f"{name}.weight" if name else f"ones_{i}",
                (width,),
                "norm",
                source=f"{name}.weight" if name else None,
                fill=None if name else 1.0,
                repeat=count,
            )
            for i, (name, count) in enumerate(groups)
        )
        heads = sum(count for _, count in groups)
        self.weight = Param((heads, width), "norm", parts=parts, dtype=dtype)

    def __call__(self, ctx: BuildContext, x: ir.Value, zeros: ir.Value | None = None) -> ir.Value:
        """``x``: [..., heads, D]; or, with ``zeros`` (a zero skip of its shape), the heads
        as rows [B, S * heads, D]. The result is [..., heads, D] either way."""
        normed = rms_norm(ctx, x, None, self.width, dtype=self.dtype, zeros=zeros)
        if zeros is not None:
            heads = self.weight.shape[0]
            normed = ctx.op.Reshape(normed, ctx.ints([0, -1, heads, self.width]))
        return ctx.op.Mul(normed, ctx.param(self.weight.name))


class FusedLinear(Module):
    """Sibling linears of one input as one MatMul (or MatMulNBits): ``x @ [W_1; W_2; ...].T``.

    The checkpoint keeps ``W_1, W_2, ...`` apart; the fused weight concatenates them along
    the output axis and is read part by part (quantizing per output row commutes with the
    concatenation, so the bytes equal the separate weights').

    Args:
        in_features: The shared input width.
        parts: ``(sibling linear name, out_features)`` in output order; a name may repeat.
        bias: The siblings have biases, fused the same way.
    """

    def __init__(
        self, in_features: int, parts: list[tuple[str, int]], *, bias: bool = False
    ) -> None:
        self.widths = tuple(width for _, width in parts)
        fused = tuple(
            LogicalWeight(f"{name}.weight", (width, in_features), "linear", source=f"{name}.weight")
            for name, width in parts
        )
        self.weight = Param((sum(self.widths), in_features), "linear", parts=fused)
        self.bias = None
        if bias:
            biases = tuple(
                LogicalWeight(f"{name}.bias", (width,), "bias", source=f"{name}.bias")
                for name, width in parts
            )
            self.bias = Param((sum(self.widths),), "bias", parts=biases)

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        out = linear(ctx, x, self.weight.name)
        if self.bias is not None:
            out = ctx.op.Add(out, ctx.param(self.bias.name))
        return out


class GatedMLP(Module):
    """``down(act(gate(x)) * up(x))``, Gemma's MLP; ``fused`` computes gate and up as one
    projection (:class:`FusedLinear`) and splits its output; ``stored_fused`` reads a
    checkpoint that keeps them as one ``gate_up_proj`` (Phi-3)."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        activation: str,
        *,
        fused: bool = False,
        stored_fused: bool = False,
    ) -> None:
        self.activation = activation
        self._fused = fused or stored_fused
        self.gate_up_proj: Linear | FusedLinear
        if stored_fused:  # the checkpoint's own gate_up_proj [2 * I, H], gate rows first
            self.gate_up_proj = Linear(hidden, 2 * intermediate)
        elif fused:
            self.gate_up_proj = FusedLinear(
                hidden, [("gate_proj", intermediate), ("up_proj", intermediate)]
            )
        else:
            self.gate_proj = Linear(hidden, intermediate)
            self.up_proj = Linear(hidden, intermediate)
        self.down_proj = Linear(intermediate, hidden)

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        if self._fused:
            both = self.gate_up_proj(ctx, x)
            gate, up = ctx.op.Split(both, axis=-1, num_outputs=2, _outputs=2)
        else:
            gate, up = self.gate_proj(ctx, x), self.up_proj(ctx, x)
        return self.down_proj(ctx, ctx.op.Mul(activation(ctx, gate, self.activation), up))
