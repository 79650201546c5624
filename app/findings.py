"""The capture audit's findings in words a user can act on (no Qt).

The engine reports one :class:`engine.audit.Finding` per node, named by the graph's
internal node names (``Slice_node_1454``), which mean nothing to a user. For display the
findings are grouped by op type and reason, with a count ("3 Slice nodes: input 1 (a shape
or index) is computed at run time"); the node names stay available for a tooltip.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.audit import Finding, SessionAudit

NAMES_SHOWN = 12
"""Node names a tooltip lists per group before "and N more"."""

_QUOTED = re.compile(r" '[^']*'")


@dataclass(frozen=True)
class FindingGroup:
    """Findings of one op type that break capture for the same reason."""

    op_type: str
    reason: str
    nodes: tuple[str, ...]

    @property
    def text(self) -> str:
        """E.g. ``3 Slice nodes: input 1 (a shape or index) is computed at run time``."""
        count = len(self.nodes)
        if self.op_type == "input":
            what = "graph input" if count == 1 else "graph inputs"
        else:
            what = f"{self.op_type} node" if count == 1 else f"{self.op_type} nodes"
        return f"{count} {what}: {self.reason}"

    @property
    def detail(self) -> str:
        """The text and the names of the nodes, for a tooltip."""
        names = [n or "(unnamed)" for n in self.nodes[:NAMES_SHOWN]]
        more = len(self.nodes) - len(names)
        return f"{self.text}\n    {', '.join(names)}" + (f" and {more} more" if more else "")


def group_findings(findings: Iterable[Finding]) -> tuple[FindingGroup, ...]:
    """Group findings by op type and reason (a value name quoted in the reason, as in
    "int64 input 'x'", is left out of the grouping key), in order of first appearance."""
    groups: dict[tuple[str, str], list[str]] = {}
    for finding in findings:
        key = (finding.op_type, _QUOTED.sub("", finding.reason))
        groups.setdefault(key, []).append(finding.node)
    return tuple(FindingGroup(op, reason, tuple(nodes)) for (op, reason), nodes in groups.items())


@dataclass(frozen=True)
class Reasons:
    """A session's reasons for display: short lines, and the same with node names."""

    lines: tuple[str, ...]
    details: tuple[str, ...]


def readable_reasons(reasons: Sequence[str], audit: SessionAudit) -> Reasons:
    """``reasons`` (as :func:`engine.audit.decide_capture` gives them) with the audit's
    per-node lines replaced, where the first of them stood, by the grouped findings."""
    per_node = set(audit.reasons()) - set(_extra_reasons(audit))
    groups = group_findings(audit.findings)
    lines: list[str] = []
    details: list[str] = []
    grouped = False
    for reason in reasons:
        if reason not in per_node:
            lines.append(reason)
            details.append(reason)
        elif not grouped:
            grouped = True
            lines += [g.text for g in groups]
            details += [g.detail for g in groups]
    return Reasons(tuple(lines), tuple(details))


def audit_lines(audit: SessionAudit) -> Reasons:
    """Every reason of one audit, findings grouped."""
    return readable_reasons(audit.reasons(), audit)


def _extra_reasons(audit: SessionAudit) -> list[str]:
    """The audit's reasons that are not findings (EP support, placement): kept as they are."""
    names = {f"{f.op_type} '{f.node}': {f.reason}" for f in audit.findings}
    return [r for r in audit.reasons() if r not in names]
