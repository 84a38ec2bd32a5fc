"""Fusion planning by search: dynamic programming over the topological order, pruned to a beam, guided by the
cost model (memory traffic, per-kernel overhead, recomputation).

Precondition and postcondition as `plan_fusion` (a legal, acyclic plan). The graph is not modified.

Each weakly connected component of fusible nodes (joined by data edges) is planned on its own: components only
interact through nodes onnxruntime runs, and cycles through those are checked on the whole graph. Within a
component, nodes are decided in topological order. Each node either starts a group, joins one of its producers'
groups, or merges all of them. Partial plans are kept in a beam of the `beam` cheapest; a plan's cost is the sum
of its groups' costs, and a group of one node costs what onnxruntime pays for that node. The greedy plan is
costed with the same model and wins ties, so search is never worse than greedy under the model.
Cycle checks use ancestor/descendant bitsets: merging a set M is illegal exactly when a node outside M is both
a descendant and an ancestor of M.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from evonnx.passes.analyze import Analysis
from evonnx.passes.classify import MapKind, classify
from evonnx.passes.cost_model import CostModel, NodeStats
from evonnx.passes.dependences import DepInfo
from evonnx.passes.lower_ops import FREE_OPS, VALUE_INPUTS
from evonnx.passes.plan_fusion import Config, _Graph, finish_plan, plan_fusion
from evonnx.records import FusionPlan


@dataclass(frozen=True)
class SearchConfig(Config):
    beam: int = 4


DEFAULT_SEARCH = SearchConfig()


class _Costing:
    """Costs of node sets under the model, memoised by member set."""

    def __init__(self, g: gs.Graph, an: Analysis, gr: _Graph, st: NodeStats, cm: CostModel):
        self.gr, self.st, self.cm = gr, st, cm
        outputs = {t.name for t in g.outputs}
        self.out_names = [[t.name for t in n.outputs] for n in gr.nodes]
        self.consumers: list[list[tuple[int, str]]] = [[] for _ in gr.nodes]  # (consumer, tensor) over data edges
        self.any_consumers: dict[str, list[int]] = {}
        producer = {t: i for i, names in enumerate(self.out_names) for t in names}
        self.data_inputs: list[list[str]] = []
        for c, n in enumerate(gr.nodes):
            value_slots = VALUE_INPUTS.get(n.op, ())
            ins = []
            for k, t in enumerate(n.inputs):
                if not t.name:
                    continue
                self.any_consumers.setdefault(t.name, []).append(c)
                info = an.tensors.get(t.name)
                if k in value_slots or (info is not None and info.known is not None):
                    continue
                ins.append(t.name)
                p = producer.get(t.name)
                if p is not None:
                    self.consumers[p].append((c, t.name))
            self.data_inputs.append(ins)
        self.graph_outputs = outputs
        self.kinds = [classify(n, an) for n in gr.nodes]
        self.cache: dict[frozenset[int], float] = {}

    def single(self, i: int) -> float:
        n = self.gr.nodes[i]
        if n.op in FREE_OPS:
            return self.cm.ort_node_us  # onnxruntime aliases these
        out = sum(self.st.nbytes.get(t, 0.0) for t in self.out_names[i])
        inp = sum(self.st.nbytes.get(t, 0.0) for t in self.data_inputs[i])
        elems = sum(self.st.numel.get(t, 0.0) for t in self.out_names[i])
        return self.cm.node_us(inp + out, elems, self.st.ops.get(n.name, (1.0, 0.0, 0.0)))

    def _reads(self, c: int, t: str) -> float:
        """Elements of tensor `t` that one element of consumer `c` reads, on average, when fused."""
        mine = self.st.numel.get(t, 1.0)
        theirs = self.st.numel.get(self.out_names[c][0], 1.0) if self.out_names[c] else 1.0
        if theirs <= 0:
            return 0.0
        ratio = mine / theirs
        kind = self.kinds[c]
        if kind is MapKind.REDUCTION or self.st.row_broadcast.get((self.gr.nodes[c].name, t), False):
            return ratio  # each output reads a whole row (or a row-invariant value hoisted per row)
        if kind in (MapKind.BROADCAST, MapKind.ONE_TO_ONE):
            return 1.0  # every output element reads one element: recomputation when broadcast
        return min(1.0, ratio)  # views and writes read each element at most once

    def group(self, members: frozenset[int]) -> float:
        if len(members) == 1:
            return self.single(next(iter(members)))
        hit = self.cache.get(members)
        if hit is not None:
            return hit
        inside = {t for m in members for t in self.out_names[m]}
        read = {t for m in members for t in self.data_inputs[m] if t not in inside}
        nbytes = sum(self.st.nbytes.get(t, 0.0) for t in read)
        demand: dict[int, float] = {}
        work = 0.0
        for m in sorted(members, reverse=True):
            d = 0.0
            for t in self.out_names[m]:
                if t in self.graph_outputs or any(c not in members for c in self.any_consumers.get(t, ())):
                    d += self.st.numel.get(t, 0.0)
                    nbytes += self.st.nbytes.get(t, 0.0)
            # consumers reading the same element at the same index share it (common subexpressions), so the
            # demand is the largest consumer's, not their sum
            d = max([d] + [demand.get(c, 0.0) * self._reads(c, t) for c, t in self.consumers[m] if c in members])
            demand[m] = d
            work += self.cm.fused_ns(d, self.st.ops.get(self.gr.nodes[m].name, (1.0, 0.0, 0.0)))
        cost = self.cm.kernel_us + self.cm.roofline(nbytes, work)
        self.cache[members] = cost
        return cost

    def plan(self, sets: list[set[int]], fusible: list[int]) -> float:
        covered: set[int] = set()
        total = 0.0
        for s in sets:
            if len(s) >= 2:
                total += self.group(frozenset(s))
                covered |= s
        return total + sum(self.single(i) for i in fusible if i not in covered)


def _bitsets(gr: _Graph) -> tuple[list[int], list[int]]:
    n = len(gr.nodes)
    desc = [0] * n
    anc = [0] * n
    for i in range(n - 1, -1, -1):
        b = 1 << i
        for s in gr.succ[i]:
            b |= desc[s]
        desc[i] = b
    preds: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for s in gr.succ[i]:
            preds[s].append(i)
    for i in range(n):
        b = 1 << i
        for p in preds[i]:
            b |= anc[p]
        anc[i] = b
    return desc, anc


@dataclass
class _State:
    group_of: dict[int, int]  # node -> group id (the group's first node)
    groups: dict[int, frozenset[int]]
    cost: float


def _components(gr: _Graph) -> list[list[int]]:
    parent = list(range(len(gr.nodes)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for c in range(len(gr.nodes)):
        if gr.fusible[c]:
            for p in gr.data_preds[c]:
                if gr.fusible[p]:
                    parent[find(p)] = find(c)
    comps: dict[int, list[int]] = {}
    for i in range(len(gr.nodes)):
        if gr.fusible[i]:
            comps.setdefault(find(i), []).append(i)
    return [sorted(c) for c in comps.values()]


def plan_search(g: gs.Graph, an: Analysis, deps: DepInfo, st: NodeStats, cm: CostModel, *,
                cfg: SearchConfig = DEFAULT_SEARCH) -> FusionPlan:
    gr = _Graph(g, an)
    costing = _Costing(g, an, gr, st, cm)
    desc, anc = _bitsets(gr)
    chosen: list[set[int]] = []
    for comp in _components(gr):
        chosen.extend(_search_component(gr, costing, comp, desc, anc, cfg))
    greedy = plan_fusion(g, an, deps, cfg=cfg)
    index = {n.name: i for i, n in enumerate(gr.nodes)}
    greedy_sets = [{index[x] for x in grp.nodes} for grp in greedy.groups]
    fusible = [i for i in range(len(gr.nodes)) if gr.fusible[i]]
    if costing.plan(greedy_sets, fusible) <= costing.plan(chosen, fusible):
        return greedy
    return finish_plan(gr, an, deps, chosen, {})


def _search_component(gr: _Graph, costing: _Costing, comp: list[int], desc: list[int], anc: list[int],
                      cfg: SearchConfig) -> list[set[int]]:
    beam = [_State({}, {}, 0.0)]
    for c in comp:
        candidates: dict[tuple, _State] = {}
        for s in beam:
            producer_groups = list(dict.fromkeys(s.group_of[p] for p in gr.data_preds[c] if p in s.group_of))
            options: list[list[int]] = [[]] + [[gid] for gid in producer_groups]
            if len(producer_groups) > 1:
                options.append(producer_groups)
            for join in options:
                members = frozenset({c}.union(*(s.groups[gid] for gid in join)))
                if len(members) > cfg.max_group or not _acyclic(members, desc, anc):
                    continue
                old = sum(costing.group(s.groups[gid]) for gid in join)
                new_cost = s.cost - old + costing.group(members)
                gid_new = min(members)
                groups = {k: v for k, v in s.groups.items() if k not in join}
                groups[gid_new] = members
                group_of = dict(s.group_of)
                for m in members:
                    group_of[m] = gid_new
                key = tuple(sorted(groups.values(), key=min))
                if key not in candidates or candidates[key].cost > new_cost:
                    candidates[key] = _State(group_of, groups, new_cost)
        beam = sorted(candidates.values(), key=lambda st_: st_.cost)[:cfg.beam]
    best = beam[0]
    return [set(m) for m in best.groups.values() if len(m) >= 2
            and costing.group(m) < sum(costing.single(i) for i in m)]


def _acyclic(members: frozenset[int], desc: list[int], anc: list[int]) -> bool:
    bits = d = a = 0
    for m in members:
        bits |= 1 << m
        d |= desc[m]
        a |= anc[m]
    return not (d & a & ~bits)
