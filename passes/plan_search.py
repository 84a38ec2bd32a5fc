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

Time is linear in the component's size for a bounded frontier (issue 8): a group's cost, member bitsets and
demands are kept as an aggregate (`_Agg`) that a joining node updates in time proportional to the nodes whose
demand it changes (merging two or more groups recomputes the merged group, at most `max_group` nodes); a
group none of whose members has a later consumer is *closed* and moves to a list shared between states, so a
state copies only its open groups. Two partial plans with the same open groups have the same futures, so only
the cheaper is kept (dynamic programming over the frontier).
"""

from __future__ import annotations

import heapq
from collections.abc import Set
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from evonnx.passes.analyze import Analysis, computed_whole, subgraph_reads
from evonnx.passes.classify import MapKind, classify
from evonnx.passes.cost_model import CostModel, NodeStats, Ops
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
        outputs = {t.name for t in g.outputs} | computed_whole(g, an)  # both are materialised
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
            for t in subgraph_reads(n):  # a subgraph's implicit input is read, so it is materialised
                self.any_consumers.setdefault(t, []).append(c)
            self.data_inputs.append(ins)
        self.graph_outputs = outputs
        self.kinds = [classify(n, an) for n in gr.nodes]
        self.cache: dict[frozenset[int], float] = {}
        self.producer = producer
        # per node, (in-group producer candidate, tensor) over its data inputs
        self.data_producers: list[list[tuple[int, str]]] = [[] for _ in gr.nodes]
        for p, cs in enumerate(self.consumers):
            for c, t in cs:
                self.data_producers[c].append((p, t))

    def single(self, i: int) -> float:
        n = self.gr.nodes[i]
        if n.op in FREE_OPS:
            return self.cm.ort_node_us  # onnxruntime aliases these
        out = sum(self.st.nbytes.get(t, 0.0) for t in self.out_names[i])
        inp = sum(self.st.nbytes.get(t, 0.0) for t in self.data_inputs[i])
        elems = sum(self.st.numel.get(t, 0.0) for t in self.out_names[i])
        ops = self.st.ort_ops.get(n.name) or self.st.ops.get(n.name, (1.0, 0.0, 0.0))
        return self.cm.node_us(inp + out, elems, ops) + self.st.ort_rows.get(n.name, 0.0) * self.cm.ort_row_ns / 1e3

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
        mat: set[str] = set()
        for m in sorted(members, reverse=True):
            d = 0.0
            for t in self.out_names[m]:
                if t in self.graph_outputs or any(c not in members for c in self.any_consumers.get(t, ())):
                    d += self.st.numel.get(t, 0.0)
                    nbytes += self.st.nbytes.get(t, 0.0)
                    mat.add(t)
            # consumers reading the same element at the same index share it (common subexpressions), so the
            # demand is the largest consumer's, not their sum
            d = max([d] + [demand.get(c, 0.0) * self._reads(c, t) for c, t in self.consumers[m] if c in members])
            demand[m] = d
            work += self.cm.fused_ns(d, self._ops(m, mat))
        cost = self.cm.kernel_us + self.cm.roofline(nbytes, work)
        self.cache[members] = cost
        return cost

    def _materialised(self, t: str, members: frozenset[int]) -> bool:
        return t in self.graph_outputs or any(c not in members for c in self.any_consumers.get(t, ()))

    def _demand(self, m: int, members: frozenset[int], demand: dict[int, float], mat: set[str]) -> float:
        """Node `m`'s demand in `members` (as `group` computes it), given its in-group consumers' demands;
        updates `mat`, the group's materialised tensors, for `m`'s outputs."""
        d = 0.0
        for t in self.out_names[m]:
            if self._materialised(t, members):
                d += self.st.numel.get(t, 0.0)
                mat.add(t)
            else:
                mat.discard(t)
        return max([d] + [demand.get(c, 0.0) * self._reads(c, t) for c, t in self.consumers[m] if c in members])

    def _ops(self, m: int, mat: Set[str]) -> Ops:
        """Node `m`'s operations per element in a group whose materialised tensors are `mat`."""
        name = self.gr.nodes[m].name
        shared = self.st.shared_ops.get(name)
        if shared is not None and not any(t in mat for t in self.out_names[m]):
            return shared
        return self.st.ops.get(name, (1.0, 0.0, 0.0))

    def agg_full(self, members: frozenset[int], desc: list[int], anc: list[int], until: int) -> _Agg:
        """The aggregate of `members`, computed from scratch in O(|members|)."""
        inside = {t for m in members for t in self.out_names[m]}
        read = {t for m in members for t in self.data_inputs[m] if t not in inside}
        mat: set[str] = set()
        demand: dict[int, float] = {}
        work = 0.0
        bits = d = a = 0
        for m in sorted(members, reverse=True):
            demand[m] = self._demand(m, members, demand, mat)
            work += self.cm.fused_ns(demand[m], self._ops(m, mat))
            bits |= 1 << m
            d |= desc[m]
            a |= anc[m]
        in_bytes = sum(self.st.nbytes.get(t, 0.0) for t in read)
        out_bytes = sum(self.st.nbytes.get(t, 0.0) for t in mat)
        return self._finish(members, demand, mat, read, in_bytes, out_bytes, work, bits, d, a, until)

    def agg_merge(self, g: _Agg, extra: list[int], bits: int, d: int, a: int, until: int) -> _Agg:
        """The aggregate of `g` plus the nodes `extra` (the new node and the members of the other groups it
        joins), updated rather than recomputed: demands are redone for `extra` and for `g`'s members that feed
        `extra` (whose outputs may stop being materialised), then for their producers as long as they change,
        in decreasing topological order (a demand depends only on the node's consumers')."""
        members = g.members.union(extra)
        read = set(g.read)
        for x in extra:
            read.difference_update(self.out_names[x])
        for x in extra:
            for t in self.data_inputs[x]:
                p = self.producer.get(t)
                if p is None or p not in members:
                    read.add(t)
        mat = set(g.mat)
        demand = dict(g.demand)
        work = g.work
        heap = [-x for x in extra]
        queued = set(extra)
        for x in extra:
            for p, _ in self.data_producers[x]:
                if p in g.members and p not in queued:
                    queued.add(p)
                    heap.append(-p)
        heapq.heapify(heap)
        fresh = set(extra)
        while heap:
            m = -heapq.heappop(heap)
            was = None if m in fresh else self._ops(m, g.mat)
            new = self._demand(m, members, demand, mat)
            ops = self._ops(m, mat)
            if was is None or new != demand[m] or ops != was:
                old = 0.0 if was is None else self.cm.fused_ns(demand[m], was)
                work += self.cm.fused_ns(new, ops) - old
                demand[m] = new
                for p, _ in self.data_producers[m]:
                    if p in members and p not in queued:
                        queued.add(p)
                        heapq.heappush(heap, -p)
        in_bytes = sum(self.st.nbytes.get(t, 0.0) for t in read)
        out_bytes = sum(self.st.nbytes.get(t, 0.0) for t in mat)
        return self._finish(members, demand, mat, read, in_bytes, out_bytes, work, bits, d, a, until)

    def _finish(self, members: frozenset[int], demand: dict[int, float], mat: set[str], read: set[str],
                in_bytes: float, out_bytes: float, work: float, bits: int, d: int, a: int, until: int) -> _Agg:
        if len(members) == 1:
            cost = self.single(next(iter(members)))
        else:
            cost = self.cm.kernel_us + self.cm.roofline(in_bytes + out_bytes, work)
        return _Agg(members, demand, frozenset(mat), frozenset(read), in_bytes, out_bytes, work, bits, d, a,
                    until, cost)

    def plan(self, sets: list[set[int]], fusible: list[int]) -> float:
        covered: set[int] = set()
        total = 0.0
        for s in sets:
            if len(s) >= 2:
                total += self.group(frozenset(s))
                covered |= s
        return total + sum(self.single(i) for i in fusible if i not in covered)


@dataclass(frozen=True, slots=True)
class _Agg:
    """An open group of a partial plan, with what joining it needs: its demands and materialised outputs (the
    cost model's state), member/descendant/ancestor bitsets (the cycle check), and `until`, the last node of the
    component that reads one of its members (after that node it can no longer grow)."""

    members: frozenset[int]
    demand: dict[int, float]
    mat: frozenset[str]
    read: frozenset[str]
    in_bytes: float
    out_bytes: float
    work: float
    bits: int
    desc: int
    anc: int
    until: int
    cost: float


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


_Closed = tuple[frozenset[int], "_Closed | None"]  # groups that can no longer grow: a list shared by states


@dataclass
class _State:
    group_of: dict[int, int]  # node -> group id (its group's first node), for nodes read by a later node only
    groups: dict[int, _Agg]  # open groups by id
    closed: _Closed | None
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
    order = _depth_first(gr, comp)
    pos = {c: k for k, c in enumerate(order)}
    last_use = {i: -1 for i in comp}  # where the last node of the component reading a node's output comes
    for c in comp:
        for p in gr.data_preds[c]:
            if p in pos:
                last_use[p] = max(last_use[p], pos[c])
    beam = [_State({}, {}, None, 0.0)]
    for k, c in enumerate(order):
        candidates: dict[frozenset[frozenset[int]], _State] = {}
        joined: dict[tuple[int, ...], _Agg | None] = {}  # this step's new groups, shared by the states
        keep: list[_Agg] = []  # keeps the ids in `joined` alive
        for s in beam:
            producer_groups = list(dict.fromkeys(s.group_of[p] for p in gr.data_preds[c] if p in s.group_of))
            options: list[list[int]] = [[]] + [[gid] for gid in producer_groups]
            if len(producer_groups) > 1:
                options.append(producer_groups)
            for join in options:
                parts = [s.groups[gid] for gid in join]
                ident = tuple(id(x) for x in parts)
                if ident not in joined:
                    keep.extend(parts)
                    joined[ident] = _grow(costing, parts, c, desc, anc, last_use[c], cfg)
                agg = joined[ident]
                if agg is None:
                    continue
                new_cost = s.cost - sum(x.cost for x in parts) + agg.cost
                gid_new = min(agg.members)
                groups = {gid: g for gid, g in s.groups.items() if gid not in join}
                group_of = {n: v for n, v in s.group_of.items() if last_use[n] > k}
                if join:
                    for n, v in group_of.items():
                        if v in join:
                            group_of[n] = gid_new
                closed = s.closed
                if agg.until > k:
                    groups[gid_new] = agg
                    if last_use[c] > k:
                        group_of[c] = gid_new
                else:  # no member is read after this node: the group is final
                    closed = (agg.members, closed)
                for gid in producer_groups:
                    if gid not in join and s.groups[gid].until <= k:
                        closed = (s.groups[gid].members, closed)
                        del groups[gid]
                key = frozenset(g.members for g in groups.values())
                if key not in candidates or candidates[key].cost > new_cost:
                    candidates[key] = _State(group_of, groups, closed, new_cost)
        beam = sorted(candidates.values(), key=lambda st_: st_.cost)[:cfg.beam]
    best = beam[0]
    found = [g.members for g in best.groups.values()]
    node = best.closed
    while node is not None:
        found.append(node[0])
        node = node[1]
    return [set(m) for m in found if len(m) >= 2 and costing.group(m) < sum(costing.single(i) for i in m)]


def _depth_first(gr: _Graph, comp: list[int]) -> list[int]:
    """A topological order of the component (over its data edges) that follows each chain as far as it goes
    before starting another, so few nodes are waiting for their consumers (the search's frontier). The graph's
    own order can put, say, every Slice of a thousand detection blocks first, all of them live until their
    consumers come a thousand nodes later."""
    in_comp = set(comp)
    preds = {c: {p for p in gr.data_preds[c] if p in in_comp} for c in comp}
    succs: dict[int, list[int]] = {c: [] for c in comp}
    for c in comp:
        for p in preds[c]:
            succs[p].append(c)
    waiting = {c: len(preds[c]) for c in comp}
    stack = [c for c in reversed(comp) if not waiting[c]]
    order: list[int] = []
    while stack:
        x = stack.pop()
        order.append(x)
        for c in sorted(succs[x], reverse=True):
            waiting[c] -= 1
            if not waiting[c]:
                stack.append(c)
    return order


def _grow(costing: _Costing, parts: list[_Agg], c: int, desc: list[int], anc: list[int], until: int,
          cfg: SearchConfig) -> _Agg | None:
    """The group of `c` joined with `parts`, or None when it is too large or would sit on a cycle."""
    if not parts:
        return costing.agg_full(frozenset((c,)), desc, anc, until)
    size = 1 + sum(len(x.members) for x in parts)
    if size > cfg.max_group:
        return None
    bits, d, a = 1 << c, desc[c], anc[c]
    for x in parts:
        bits, d, a = bits | x.bits, d | x.desc, a | x.anc
    if d & a & ~bits:
        return None
    base = max(parts, key=lambda x: len(x.members))
    extra = [c] + [m for x in parts if x is not base for m in x.members]
    return costing.agg_merge(base, extra, bits, d, a, max([until] + [x.until for x in parts]))
