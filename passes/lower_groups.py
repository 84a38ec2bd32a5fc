"""Lower each fusion group to a `KernelSpec`: its inputs, and per needed output the element expression.

Precondition: a plan from `plan_fusion` on the same graph and analysis. Postcondition: one spec per group that
has a needed output (a group whose outputs nobody reads is dropped), and the set of tensors the rewritten graph
still needs. A group output is *needed* when a graph output or a node outside the group that is itself needed
reads it; a fused kernel reads only its data inputs, so shape arithmetic feeding it can disappear.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence, Set
from dataclasses import replace

import onnx_graphsurgeon as gs

from evonnx.errors import InternalError
from evonnx.expr import INTS, Expr, IndexVal, Load, Op, Picked, TableLoad, const, is_exact, walk
from evonnx.index import SIZE_MAX, Atom, FloorDiv, Lookup, Max, Min, Mod, Poly, PolyLike, Sym, Var, var
from evonnx.passes import lazy as L
from evonnx.passes.analyze import Analysis, computed_whole, left_and_may_fail, node_reads
from evonnx.passes.lazy import Lazy, Reject
from evonnx.passes.lower_ops import VALUE_INPUTS, Value, lower_node
from evonnx.records import FusionGroup, FusionPlan, KernelInput, KernelOutput, KernelSpec, Rejection, SizeCheck


def _group_inputs(nodes: Sequence[gs.Node], an: Analysis) -> list[str]:
    inside = {t.name for n in nodes for t in n.outputs}
    out: list[str] = []
    for n in nodes:
        value_slots = VALUE_INPUTS.get(n.op, ())
        for k, t in enumerate(n.inputs):
            if not t.name or t.name in inside or k in value_slots or t.name in out:
                continue
            if an.tensors[t.name].known is not None:
                continue
            out.append(t.name)
    return out


def needed_tensors(g: gs.Graph, plan: FusionPlan, an: Analysis, also: Set[str] = frozenset()) -> set[str]:
    """Tensors that the rewritten graph must still produce (fixpoint over groups and unfused nodes), `also`
    (tensors kernels read for their dims alone), what nodes left to onnxruntime that may fail read (they run
    whether read or not: `left_and_may_fail`) and what computes them included."""
    by_name = {n.name: n for n in g.nodes}
    grouped = {name for grp in plan.groups for name in grp.nodes}
    units: list[tuple[list[str], list[str]]] = []  # (outputs, inputs needed when live)
    for grp in plan.groups:
        nodes = [by_name[x] for x in grp.nodes]
        units.append(([t.name for n in nodes for t in n.outputs], _group_inputs(nodes, an)))
    for n in g.nodes:
        if n.name not in grouped:
            units.append(([t.name for t in n.outputs], node_reads(n)))
    needed = {t.name for t in g.outputs} | set(also)
    needed.update(t for n in g.nodes if n.name not in grouped and left_and_may_fail(n, an) for t in node_reads(n))
    changed = True
    while changed:
        changed = False
        for outs, ins in units:
            if any(o in needed for o in outs):
                for i in ins:
                    if i not in needed:
                        needed.add(i)
                        changed = True
    whole = computed_whole(g, an)  # a live group computes these whole (their inputs are its inputs already)
    for outs, _ in units[:len(plan.groups)]:
        if any(o in needed for o in outs):
            needed.update(o for o in outs if o in whole)
    return needed


def _reads(e: Expr) -> list[str]:
    loads = sorted({f"in{x.slot}[{x.index}]" for x in walk(e) if isinstance(x, Load)})
    return loads[:6] + ([f"... {len(loads) - 6} more"] if len(loads) > 6 else [])


def lower_group(g: gs.Graph, group: FusionGroup, an: Analysis, needed: set[str]) -> KernelSpec | None:
    by_name = {n.name: n for n in g.nodes}
    nodes = [by_name[x] for x in group.nodes]
    slots: dict[str, int] = {}
    env: dict[str, Lazy] = {}
    checks: list[SizeCheck] = []
    for node in nodes:
        args: list[Lazy | None] = []
        vals: list[Value | None] = []
        value_slots = VALUE_INPUTS.get(node.op, ())
        for k, t in enumerate(node.inputs):
            if not t.name:
                args.append(None)
                vals.append(None)
                continue
            info = an.tensors[t.name]
            vals.append(info.value)
            if t.name in env:
                args.append(env[t.name])
            elif info.known is not None:
                args.append(info.known.lazy())
                checks.extend(info.checks)  # sizes in it (a constant has none): see below
            elif k in value_slots:
                if info.derived is None:
                    raise InternalError(f"value input {k} of node '{node.name}' is not known at plan time")
                args.append(info.derived.lazy())
                checks.extend(info.checks)  # the nodes that relied on them may not run any more
            else:
                assert info.dtype is not None and info.shape is not None
                slot = slots.setdefault(t.name, len(slots))
                args.append(L.source(slot, info.dtype, info.shape, info.uniform))
        try:
            with L.collect_checks() as found:
                outs = lower_node(node.op, dict(node.attrs), args, vals, len(node.outputs))
            checks.extend(replace(c, why=f"{c.why} in node '{node.name}'") for c in found)
        except Reject as r:
            raise InternalError(f"node '{node.name}' lowered alone but not in group {group.name}: {r}") from r
        for t, lz in zip(node.outputs, outs):
            env[t.name] = lz

    outputs: list[KernelOutput] = []
    for node in nodes:
        for t in node.outputs:
            if t.name not in needed:
                continue
            lz = env[t.name]
            index = tuple(var(f"i{k}", d) for k, d in enumerate(lz.shape))
            # An output with no elements computes none: its element function is not evaluated, since an index into
            # an empty tensor is 0 by convention and a Slice behind it may map 0 past what it reads (a Gather's
            # table of 4 read at 5; fuzz seed 210028)
            e = const(0, lz.dtype) if any(d.const == 0 for d in lz.shape) else lz.fn(index)
            outputs.append(KernelOutput(t.name, lz.dtype, lz.shape, index, e, tuple(_reads(e)), lz.empty_shape))
    if not outputs:
        return None
    inputs = [KernelInput(name, an.tensors[name].dtype or "", an.tensors[name].shape or ()) for name in slots]
    _bind_symbols(inputs, outputs, an, checks)
    if not inputs:
        # Everything the group computes is constant (a ConstantOfShape too big to fold, say): onnxruntime folds
        # such nodes once at session start, where a kernel would recompute them on every Run (and its schema
        # takes at least one input). They stay with onnxruntime.
        return None
    return KernelSpec(group.name, tuple(inputs), tuple(outputs), group.nodes, group.ops,
                      all(is_exact(o.expr) for o in outputs),
                      tuple({(c.kind, c.lhs, c.rhs, c.unless): c for c in checks}.values()))


def _syms_of(outputs: Sequence[KernelOutput], inputs: Sequence[KernelInput],
             checks: Sequence[SizeCheck] = ()) -> set[Sym]:
    out: set[Sym] = set()
    for c in checks:
        out |= c.lhs.syms() | c.rhs.syms() | (c.unless.syms() if c.unless is not None else set())
    for o in outputs:
        for d in (*o.shape, *(o.empty_shape or ())):
            out |= d.syms()
        for x in walk(o.expr):
            if isinstance(x, Load):
                out |= x.index.syms()
            idx = getattr(x, "index", None) or getattr(x, "poly", None) or getattr(x, "var", None)
            if isinstance(idx, Poly):
                out |= idx.syms()  # a Reduce's var: its extent's sizes (a reduction over an expanded input)
    for i in inputs:
        for d in i.shape:
            out |= d.syms()
    return out


def _bind_symbols(inputs: list[KernelInput], outputs: Sequence[KernelOutput], an: Analysis,
                  checks: Sequence[SizeCheck] = ()) -> None:
    """Every size symbol a kernel uses must be readable from one of its inputs' dims at run time; when none
    has it, the tensor it came from becomes an extra input (only its shape is read)."""
    for s in sorted(_syms_of(outputs, inputs, checks), key=lambda s: s.name):
        if any(Poly.of(s) in i.shape for i in inputs):
            continue
        origin = an.sym_origin.get(s.name)
        if origin is None:
            raise InternalError(f"size symbol {s.name} has no origin tensor")
        name = origin[0]
        info = an.tensors[name]
        inputs.append(KernelInput(name, info.dtype or "", info.shape or ()))


def lower_groups(g: gs.Graph, plan: FusionPlan, an: Analysis) -> tuple[list[KernelSpec], set[str]]:
    """The groups' kernels and the tensors the rewritten graph must produce. A kernel that reads a tensor for its
    dims alone (`_bind_symbols`) keeps that tensor's producer running, and with it what the producer reads: a
    ScatterND left to onnxruntime whose output only a Shape reads, its data computed inside the kernel (fuzz seed
    250029). Those tensors join `needed` and the groups are lowered again, until none is new; a kernel that then
    reads dims computed from its own outputs is on a cycle (`kernels_on_cycle`).
    A group that lowers to no kernel (all its values constant, or none needed) leaves its nodes to onnxruntime,
    which runs what it cannot fold (a constant that holds only under a size check) and reads what they read: the
    fixpoint counts them as nodes left, not as a group (fuzz case 6891 of seed 31000000: a ConstantOfShape chain of
    a Shape, known only under a check, read a Slice that a kernel computed inside and did not export)."""
    extra: set[str] = set()
    left: set[str] = set()  # groups lowered to no kernel
    while True:
        kept = replace(plan, groups=tuple(grp for grp in plan.groups if grp.name not in left))
        needed = needed_tensors(g, kept, an, extra)
        lowered = [(grp.name, lower_group(g, grp, an, needed)) for grp in kept.groups]
        specs = [s for _, s in lowered if s is not None]
        shape_reads = {i.name for s in specs for i in s.inputs} - needed
        nothing = {name for name, s in lowered if s is None}
        if not shape_reads and not nothing:
            return specs, needed
        extra |= shape_reads
        left |= nothing


def kernels_on_cycle(g: gs.Graph, specs: Sequence[KernelSpec]) -> list[str]:
    """The kernels on one cycle of the rewritten graph (each kernel one node reading all its inputs, the
    shape-only ones that `_bind_symbols` adds included), or [] when it is acyclic. The planner's cycle checks
    see data edges only: a kernel that reads the dims of a tensor onnxruntime computes from the kernel's own
    outputs (a size symbol born at a node onnxruntime runs) closes a cycle they do not see."""
    fused = {n for s in specs for n in s.source_nodes}
    units: list[tuple[str, list[str], list[str]]] = [
        (f"kernel {s.name}", [i.name for i in s.inputs], [o.name for o in s.outputs]) for s in specs]
    units += [(f"node {n.name}", node_reads(n), [t.name for t in n.outputs]) for n in g.nodes if n.name not in fused]
    producer = {t: k for k, (_, _, outs) in enumerate(units) for t in outs}
    succ: list[list[int]] = [[] for _ in units]
    for k, (_, ins, _) in enumerate(units):
        for t in dict.fromkeys(ins):
            if t in producer:
                succ[producer[t]].append(k)
    state = [0] * len(units)  # 0 unseen, 1 on the DFS path, 2 done
    for root in range(len(units)):
        if state[root]:
            continue
        path, stack = [root], [iter(succ[root])]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state[nxt] == 1:
                cycle = path[path.index(nxt):]
                return [units[k][0].removeprefix("kernel ") for k in cycle if units[k][0].startswith("kernel ")]
            elif state[nxt] == 0:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(succ[nxt]))
    return []


def overflows(p: PolyLike) -> bool:
    """Whether evaluating `p` in int64, term by term as C does, could overflow: a term's coefficient times
    SIZE_MAX (a product of sizes and loop variables indexes memory, so it stays below SIZE_MAX), summed over the
    terms, above INT64_MAX; or the same inside a floor division, remainder, min/max, lookup index or loop extent.
    Exporters' INT64_MAX bounds and steps over symbolic sizes are what this finds."""
    total = 0
    for mono, c in Poly.of(p).terms:
        total += abs(c) * (SIZE_MAX if mono else 1)
        if any(_atom_overflows(a) for a in mono):
            return True
    return total > INT64_MAX


@functools.lru_cache(maxsize=1 << 16)  # each atom once: nested min/max share subexpressions (fuzz case 109)
def _atom_overflows(a: Atom) -> bool:
    if isinstance(a, Var):
        return overflows(a.extent)
    if isinstance(a, (FloorDiv, Mod)):
        return overflows(a.num) or overflows(a.den)
    if isinstance(a, (Min, Max)):
        return overflows(a.a) or overflows(a.b)
    if isinstance(a, Lookup):
        return overflows(a.index)
    return False


INT64_MAX = (1 << 63) - 1


def _kernel_polys(s: KernelSpec) -> list[Poly]:
    """Every size and index polynomial of a kernel: its shapes, checks, output positions and loads."""
    polys = [d for i in s.inputs for d in i.shape] + [d for o in s.outputs for d in o.shape]
    polys += [p for c in s.checks for p in (c.lhs, c.rhs, c.unless) if p is not None]
    for o in s.outputs:
        polys += list(o.index)
        for x in walk(o.expr):
            idx = getattr(x, "index", None) or getattr(x, "poly", None) or getattr(x, "var", None)
            if isinstance(idx, Poly):
                polys.append(idx)
    return polys


def overflowing_kernels(specs: Sequence[KernelSpec]) -> list[str]:
    """The kernels with an index or size polynomial whose int64 evaluation could overflow (`overflows`: a
    Range with a step near 2**63 over a symbolic limit, a Slice step of INT64_MIN on a symbolic dim).
    Such a kernel is left to onnxruntime, whose own arithmetic the fused one could not reproduce safely."""
    return [s.name for s in specs if any(overflows(p) for p in _kernel_polys(s))]


# The largest index or size polynomial a kernel may print, in atoms written out as a tree (Poly.weight): the
# strides of a tensor whose dims are sums multiply out (six dims of ten terms each: a million terms), beyond what
# the printer and gcc take in reasonable time. analyze.MAX_SIZE_WEIGHT bounds each size; this bounds what sizes
# multiply into.
MAX_INDEX_WEIGHT = 1 << 15


def oversized_kernels(specs: Sequence[KernelSpec]) -> list[str]:
    """The kernels with a polynomial above MAX_INDEX_WEIGHT: left to onnxruntime."""
    return [s.name for s in specs if any(p.weight() > MAX_INDEX_WEIGHT for p in _kernel_polys(s))]


def _picks(x: Expr) -> list[Picked]:
    """The positions `x` reads at that are picked at run time (a Gather's indices), nested ones included."""
    if not isinstance(x, Load | TableLoad | IndexVal):
        return []
    p = x.poly if isinstance(x, IndexVal) else x.index
    return [a for a in p.atoms() if isinstance(a, Picked)]


def _slots(e: Expr) -> set[int]:
    """The input slots `e` reads, at run-time positions included (the loads of a Gather's index)."""
    out: set[int] = set()
    for x in walk(e):
        if isinstance(x, Load):
            out.add(x.slot)
        for a in _picks(x):
            out |= {y.slot for y in walk(a.value) if isinstance(y, Load)}
    return out


Origins = dict[str, frozenset[str]]

# outputs of onnxruntime's nodes that carry no inexact value on: sizes, and TopK's indices, whose choices the check
# replays in the original (excuses.near_ties), everything after them then computed from the same indices; and
# NonMaxSuppression's selected indices, which its inputs decide only through comparisons (score order, IoU against
# the threshold), as TopK's do: a last bit moves them only at a near tie, which the check replays too
# (excuses.nms_near_ties). Without this, one kernel gathering the selected boxes sent back every kernel before the
# NMS (yolov7's and YOLOv6's End2End exports, EfficientDet's BiFPN)
_CLEAN_OUTPUTS = {"Shape": (0,), "Size": (0,), "TopK": (1,), "NonMaxSuppression": (0,)}


def inexact_origins(g: gs.Graph, an: Analysis, specs: Sequence[KernelSpec]) -> Origins:
    """For each tensor, the kernels whose own inexact arithmetic (an exp, a float sum, ...) its value depends on,
    through other kernels and onnxruntime's nodes alike: a kernel that reads another's output as a plain load
    computes exactly from a value that is not onnxruntime's (fuzz case 1220: a Mod in one kernel of an exp in
    another). Graph inputs and constants have none, nor do the comparisons against a threshold whose near ties
    the check replays (`near_tie_tensors`)."""
    fused = {n for s in specs for n in s.source_nodes}
    ties = near_tie_tensors(g, an)
    made: dict[str, tuple[frozenset[str], list[str]]] = {t: (frozenset(), []) for t in ties}
    for s in specs:  # tensor -> (own origins, tensors it is computed from)
        for o in s.outputs:
            made.setdefault(o.name, (frozenset() if is_exact(o.expr) else frozenset({s.name}),
                                     [s.inputs[k].name for k in sorted(_slots(o.expr))]))
    for n in g.nodes:
        if n.name in fused:
            continue
        reads = [t.name for t in n.inputs if t.name]
        for k, t in enumerate(n.outputs):
            made.setdefault(t.name, (frozenset(), [] if k in _CLEAN_OUTPUTS.get(n.op, ()) else reads))
    out: Origins = {}
    for root in made:  # iterative post-order: chains may be thousands of tensors deep
        stack = [(root, False)]
        while stack:
            name, ready = stack.pop()
            if name in out:
                continue
            own, reads = made.get(name, (frozenset(), []))
            if not ready:
                stack.append((name, True))
                stack += [(r, False) for r in reads if r not in out and r in made]
                continue
            out[name] = own.union(*(out.get(r, frozenset()) for r in reads))
    return out


def _inexact_in(s: KernelSpec, e: Expr, origins: Origins) -> frozenset[str]:
    """The kernels to leave so that `e`, computed in kernel `s`, is onnxruntime's value: `s` where its own
    arithmetic in `e` is inexact, and the kernels whose inexact values it reads."""
    own = frozenset() if is_exact(e) else frozenset({s.name})
    return own.union(*(origins.get(s.inputs[k].name, frozenset()) for k in _slots(e)))


def ill_conditioned_kernels(specs: Sequence[KernelSpec], origins: Origins) -> list[str]:
    """The kernels to leave so that no Mod takes an inexact value (exp, a float sum, ...: `_inexact_in`, across
    kernels too). The remainder is exact, but its operand's last bit against onnxruntime's can move it by up to
    the divisor: fmod(exp(x), x) at x = 25 is a remainder of 7.2e10, whose last bit is 4096 (fuzz seed 8,
    case000172). Such kernels are left to onnxruntime, so that the remainder is taken of onnxruntime's own value.
    The same for a position picked at run time from an inexact value (a Gather's indices: fuzz case 1261)."""
    out: set[str] = set()
    for s in specs:
        for o in s.outputs:
            for x in walk(o.expr):
                if isinstance(x, Op) and x.op == "mod":
                    out.update(*(_inexact_in(s, a, origins) for a in x.args))
                for a in _picks(x):
                    out |= _inexact_in(s, a.value, origins)
    return sorted(out)


# the inputs onnxruntime's nodes read as positions, counts or shapes, beyond the ones a kernel reads at plan time
_POSITIONS = {**{op: k for op, k in VALUE_INPUTS.items() if op not in ("Shape", "Size")},
              "Gather": (1,), "GatherElements": (1,), "GatherND": (1,), "TopK": (1,), "OneHot": (0, 1),
              "Pad": (1, 3), "Resize": (3,), "NonZero": (0,), "Compress": (1,), "CumSum": (1,), "Trilu": (1,),
              "NonMaxSuppression": (2,), "RoiAlign": (2,), "Scatter": (1,)}


# comparisons whose result an operand's last bit flips only at a near tie of its two sides: the check replays a
# kernel's flip of one in the original (excuses.near_ties), as it does a TopK's choice. Not Equal: a mask of
# x == max(x) flips wherever the max is computed from values a last bit apart, near tie or not.
THRESHOLDS = ("Greater", "Less", "GreaterOrEqual", "LessOrEqual")


def inexact_position_kernels(g: gs.Graph, an: Analysis, specs: Sequence[KernelSpec], origins: Origins) -> list[str]:
    """The kernels to leave so that no integer or bool kernel output computed from an inexact value (a Cast of an
    Exp, here or in a kernel it reads) is read by a node left to onnxruntime as positions, a count or a shape:
    the output's last bit against onnxruntime's may flip at a rounding threshold, which the check excuses in the
    output itself, but not in the other elements that onnxruntime then picks (fuzz case 1261, seed 970000: a
    GatherElements at such indices). An integer Mod of such a value is left by `ill_conditioned_kernels`. The
    output of a comparison of floats (`THRESHOLDS`) is kept: the check replays its near ties (torchvision's
    NonZero(Greater(score, threshold)) picking the candidate boxes)."""
    ties = near_tie_tensors(g, an)
    made = {o.name: (s, o) for s in specs for o in s.outputs if (o.dtype in INTS or o.dtype == "bool")
            and o.name not in ties}
    out: set[str] = set()
    for n in g.nodes:
        if n.domain not in (None, "", "ai.onnx"):
            continue
        for k in _POSITIONS.get(n.op, ()):
            if k < len(n.inputs) and n.inputs[k].name in made:
                s, o = made[n.inputs[k].name]
                out |= _inexact_in(s, o.expr, origins)
    return sorted(out)


def near_tie_tensors(g: gs.Graph, an: Analysis) -> set[str]:
    """The outputs of the comparisons of floats against a threshold (`THRESHOLDS`): where a kernel computes one as
    an output, or onnxruntime computes one from a kernel's value, the check replays its flips at near ties in the
    original (excuses.near_ties), so it carries no inexact origin on, as TopK's indices do not. One a kernel
    computes inside an expression is that expression's own arithmetic (`_inexact_in`): the check cannot see it."""
    floats = ("float16", "bfloat16", "float32", "float64")
    return {n.outputs[0].name for n in g.nodes
            if n.op in THRESHOLDS and n.domain in (None, "", "ai.onnx") and len(n.inputs) == 2 and n.outputs
            and all(t.name in an.tensors and an.tensors[t.name].dtype in floats for t in n.inputs)}


def without_groups(plan: FusionPlan, g: gs.Graph, names: Sequence[str], reason: str) -> FusionPlan:
    """`plan` with the groups `names` left to onnxruntime, each of their nodes rejected for `reason`."""
    ops = {n.name: n.op for n in g.nodes}
    gone = [grp for grp in plan.groups if grp.name in names]
    return replace(plan, groups=tuple(grp for grp in plan.groups if grp.name not in names),
                   rejected=plan.rejected + tuple(Rejection(n, ops.get(n, ""), reason) for grp in gone
                                                  for n in grp.nodes))
