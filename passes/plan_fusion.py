"""Greedy fusion planning over the topological order (the foundation planner; search comes separately).

Precondition: a toposorted graph with unique node names, and its `Analysis`. Postcondition: a `FusionPlan`
whose groups are sets of nodes that evonnx can lower, connected by data edges, whose merge creates no cycle in
the graph of groups; every other node carries the reason it stays with onnxruntime. The graph is not modified.

Edges through *value inputs* (Reshape's shape, Slice's starts, ...) and through tensors known at plan time do
not tie a node to its producer: a fused kernel never reads them, so the fused node will not consume them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from evonnx.passes.analyze import Analysis, subgraph_reads
from evonnx.passes.dependences import DepInfo, copies_removed
from evonnx.passes.lazy import Reject
from evonnx.passes.lower_ops import FREE_OPS, REDUCTIONS, SHAPE_ONLY_OPS, VALUE_INPUTS
from evonnx.records import FusionGroup, FusionPlan, Rejection

MAX_GROUP = 256


@dataclass(frozen=True)
class Config:
    max_group: int = MAX_GROUP


DEFAULT_CONFIG = Config()


class _Graph:
    """Node-index adjacency of a graphsurgeon graph, with the data/value edge distinction."""

    def __init__(self, g: gs.Graph, an: Analysis):
        self.nodes = list(g.nodes)
        self.index = {id(n): i for i, n in enumerate(self.nodes)}
        producer: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            for t in n.outputs:
                producer[t.name] = i
        self.static = [bool(n.outputs) and all(an.tensors.get(t.name) is not None
                                               and an.tensors[t.name].known is not None for t in n.outputs)
                       for n in self.nodes]
        self.fusible = [isinstance(an.lowered.get(n.name), list) and not self.static[i]
                        for i, n in enumerate(self.nodes)]
        self.data_preds: list[list[int]] = [[] for _ in self.nodes]
        self.succ: list[set[int]] = [set() for _ in self.nodes]
        self.producer = producer
        self.graph_outputs = {t.name for t in g.outputs}
        self.readers: dict[str, set[int]] = {}  # tensor -> every node that reads it, subgraph captures included
        for c, n in enumerate(self.nodes):
            for t in n.inputs:
                if t.name:
                    self.readers.setdefault(t.name, set()).add(c)
            for name in subgraph_reads(n):
                self.readers.setdefault(name, set()).add(c)
        for c, n in enumerate(self.nodes):
            value_slots = VALUE_INPUTS.get(n.op, ())
            for k, t in enumerate(n.inputs):
                p = producer.get(t.name) if t.name else None
                if p is None:
                    continue
                known = an.tensors.get(t.name) is not None and an.tensors[t.name].known is not None
                is_value = k in value_slots or known
                if not (is_value and self.fusible[c]):
                    self.succ[p].add(c)
                if not is_value and p not in self.data_preds[c]:
                    self.data_preds[c].append(p)
            for t in subgraph_reads(n):  # implicit inputs of If/Loop/Scan bodies: an edge, never fused through
                p = producer.get(t)
                if p is not None:
                    self.succ[p].add(c)


def _creates_cycle(gr: _Graph, group: set[int]) -> bool:
    """True when some path leaves `group` and comes back into it (the merged node would be in a cycle).

    Node indices are a topological order, so a path that comes back into the group never passes a node after
    the group's last member: the search stops there, and a chain grown at its end costs O(1) per step."""
    last = max(group)
    stack = [s for m in group for s in gr.succ[m] if s not in group and s < last]
    seen: set[int] = set()
    while stack:
        x = stack.pop()
        if x in group:
            return True
        if x in seen:
            continue
        seen.add(x)
        stack.extend(s for s in gr.succ[x] if s <= last)
    return False


def plan_fusion(g: gs.Graph, an: Analysis, deps: DepInfo, *, cfg: Config = DEFAULT_CONFIG) -> FusionPlan:
    """Greedy, as TVM's FuseOps does it: each node joins the groups of its fusible producers in topological order
    when no cycle results; reductions are sinks (their consumers do not join them)."""
    gr = _Graph(g, an)
    n = len(gr.nodes)
    group_of = list(range(n))
    members: dict[int, set[int]] = {i: {i} for i in range(n)}
    blocked: dict[int, str] = {}
    for c in range(n):
        if not gr.fusible[c]:
            continue
        for p in gr.data_preds[c]:
            if not gr.fusible[p]:
                continue
            if gr.nodes[p].op in REDUCTIONS:
                blocked.setdefault(c, "its producer is a reduction, which the greedy planner keeps as a sink")
                continue
            a, b = group_of[p], group_of[c]
            if a == b:
                continue
            merged = members[a] | members[b]
            if len(merged) > cfg.max_group:
                continue
            if _creates_cycle(gr, merged):
                blocked[c] = "fusing it with its producers would create a cycle"
                continue
            for m in members[b]:
                group_of[m] = a
            members[a] = merged
            del members[b]
    return finish_plan(gr, an, deps, list(members.values()), blocked)


def _condensed_cycle(gr: _Graph, sets: list[set[int]]) -> set[int] | None:
    """Members of one group on a cycle of the graph of groups, or None when the groups form a DAG. Two groups can
    reach each other through members that are not connected inside either group."""
    unit = list(range(len(gr.nodes)))
    for k, s in enumerate(sets):
        for m in s:
            unit[m] = len(gr.nodes) + k
    succ: dict[int, set[int]] = {}
    for a in range(len(gr.nodes)):
        for b in gr.succ[a]:
            if unit[a] != unit[b]:
                succ.setdefault(unit[a], set()).add(unit[b])
    color: dict[int, int] = {}
    for start in set(unit):
        if start in color:
            continue
        stack = [(start, iter(succ.get(start, ())))]
        color[start] = 1
        while stack:
            u, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[u] = 2
                stack.pop()
            elif color.get(nxt) == 1:
                for v, _ in stack[[x for x, _ in stack].index(nxt):]:
                    if v >= len(gr.nodes):
                        return sets[v - len(gr.nodes)]
            elif nxt not in color:
                color[nxt] = 1
                stack.append((nxt, iter(succ.get(nxt, ()))))
    return None


# Ops whose output is their input's bytes under another shape: onnxruntime runs them as an alias, without a copy
# (the free ops less Shape and Size, which read only the shape and output something else).
VIEW_OPS = FREE_OPS - SHAPE_ONLY_OPS


def _without_duplicate_views(gr: _Graph, members: set[int]) -> set[int]:
    """`members` less the view ops at its tail whose input is materialised anyway: read outside the group (or a
    graph output), or not computed in it. Kept, such a view makes the kernel write the same values twice, once
    per shape (an mmdetection head reads a Sigmoid's output and its Flatten: 2x the kernel's time on RetinaNet's
    80x80 level); left to onnxruntime, it is an alias of the kernel's output. A chain of views at the tail goes
    whole, from its end."""
    def escapes(t: str) -> bool:
        return t in gr.graph_outputs or any(c not in members for c in gr.readers.get(t, ()))

    def materialised(t: str) -> bool:
        """`t`, followed back through member views each read only by the next, is a kernel input or output."""
        while True:
            p = gr.producer.get(t)
            if p not in members or escapes(t):
                return True
            node = gr.nodes[p]
            if node.op not in VIEW_OPS or len(gr.readers.get(t, ())) != 1 or not node.inputs[0].name:
                return False
            t = node.inputs[0].name

    members = set(members)
    changed = True
    while changed:
        changed = False
        for i in sorted(members):
            node = gr.nodes[i]
            if node.op not in VIEW_OPS or not node.inputs or not node.inputs[0].name:
                continue
            if any(c in members for t in node.outputs for c in gr.readers.get(t.name, ())):
                continue  # not at the tail: a member reads its output
            if any(t.name and gr.producer.get(t.name) in members for t in node.inputs[1:]):
                continue  # its shape is computed in the group: leaving the view would make that escape instead
            if materialised(node.inputs[0].name):
                members.discard(i)
                changed = True
    return members


def finish_plan(gr: _Graph, an: Analysis, deps: DepInfo, sets: list[set[int]],
                blocked: dict[int, str]) -> FusionPlan:
    """Name the groups worth keeping and give every other node its reason; shared by both planners."""
    sets = [_without_duplicate_views(gr, set(s)) for s in sets]
    sets = [s for s in sets if len(s) >= 2]
    while (bad := _condensed_cycle(gr, sets)) is not None:
        sets.remove(bad)  # safety net: dissolve a group on a cycle of groups, then look again
        for i in bad:
            blocked[i] = "its group would sit on a cycle of fused groups"
    groups: list[FusionGroup] = []
    grouped: set[int] = set()
    reasons: dict[int, str] = {}
    for idx in sorted((sorted(s) for s in sets), key=lambda xs: xs[0]):
        ops = tuple(gr.nodes[i].op for i in idx)
        if all(op in FREE_OPS for op in ops):
            for i in idx:
                reasons[i] = "only aliasing ops (Reshape, Squeeze, ...), which onnxruntime runs without copying"
            continue
        names = tuple(gr.nodes[i].name for i in idx)
        digest = hashlib.sha1("\n".join(names).encode()).hexdigest()[:8]
        groups.append(FusionGroup(f"evo{len(groups)}_{digest}", names, ops))
        grouped.update(idx)

    rejected = []
    for i, node in enumerate(gr.nodes):
        if i in grouped:
            continue
        lowered = an.lowered.get(node.name)
        if isinstance(lowered, Reject):
            reason = lowered.reason
        elif gr.static[i]:
            reason = "value known at plan time (folded into its consumers)"
        elif i in reasons:
            reason = reasons[i]
        elif i in blocked:
            reason = blocked[i]
        else:
            reason = "no fusible neighbour"
        rejected.append(Rejection(node.name, node.op, reason))
    fused = {name for grp in groups for name in grp.nodes}
    return FusionPlan(tuple(groups), tuple(rejected), copies_removed(deps, fused))
