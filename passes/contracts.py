"""The passes' postconditions, checked between them when `EVONNX_DEBUG=1` (the test suite and the fuzzer set it):
a pass that breaks one is a bug in evonnx, reported as an InternalError naming the pass and what broke, instead
of a wrong plan that a later pass or the check may or may not notice.

- analyze: every node has its lowering or the reason it is left; a lowered node has one Lazy per output, and
  each output's recorded shape is its lowering's.
- plan: groups are disjoint, hold only lowered nodes of the graph, in topological order, and no node is both in
  a group and rejected.
- lower_groups: kernels have distinct names; a kernel reads only tensors of the graph and writes only outputs of
  its own group's nodes; each output has one loop variable per axis.
- rewrite: the graph is in topological order, every node input and graph output has a producer (a node, a graph
  input or a constant), and each Fused node is one of the kernels, once (a kernel whose outputs all became
  constants or unread is gone).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_graphsurgeon as gs

from evonnx.errors import InternalError
from evonnx.model import DOMAIN
from evonnx.passes.analyze import Analysis
from evonnx.records import FusionPlan, KernelSpec


def _broken(stage: str, what: str) -> InternalError:
    return InternalError(f"after {stage}: {what}")


def after_analyze(g: gs.Graph, an: Analysis) -> None:
    for n in g.nodes:
        result = an.lowered.get(n.name)
        if result is None:
            raise _broken("analyze", f"node '{n.name}' ({n.op}) has neither a lowering nor a reason")
        if isinstance(result, list):
            if len(result) != len(n.outputs):
                raise _broken("analyze", f"node '{n.name}' ({n.op}) has {len(result)} lowered outputs for "
                                         f"{len(n.outputs)}")
            for o, lz in zip(n.outputs, result):
                info = an.tensors.get(o.name)
                if info is None or info.shape != lz.shape:
                    raise _broken("analyze", f"tensor '{o.name}' of '{n.name}' ({n.op}) is recorded with shape "
                                             f"{None if info is None else info.shape}, lowered as {lz.shape}")


def after_plan(g: gs.Graph, an: Analysis, plan: FusionPlan) -> None:
    order = {n.name: k for k, n in enumerate(g.nodes)}
    rejected = {r.node for r in plan.rejected}
    seen: set[str] = set()
    for grp in plan.groups:
        for name in grp.nodes:
            if name not in order:
                raise _broken("plan", f"group {grp.name} holds node '{name}', which is not in the graph")
            if name in seen:
                raise _broken("plan", f"node '{name}' is in two groups")
            if name in rejected or not isinstance(an.lowered.get(name), list):
                raise _broken("plan", f"group {grp.name} holds node '{name}', which is left to onnxruntime")
            seen.add(name)
        if [order[x] for x in grp.nodes] != sorted(order[x] for x in grp.nodes):
            raise _broken("plan", f"group {grp.name} is not in topological order")


def after_lower(g: gs.Graph, plan: FusionPlan, specs: Sequence[KernelSpec]) -> None:
    tensors = g.tensors()
    by_name = {n.name: n for n in g.nodes}
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise _broken("lower_groups", "two kernels share a name")
    for s in specs:
        for i in s.inputs:
            if i.name not in tensors:
                raise _broken("lower_groups", f"kernel {s.name} reads '{i.name}', which is not in the graph")
        produced = {o.name for n in s.source_nodes if n in by_name for o in by_name[n].outputs}
        for o in s.outputs:
            if o.name not in produced:
                raise _broken("lower_groups", f"kernel {s.name} writes '{o.name}', which its nodes do not compute")
            if len(o.index) != len(o.shape):
                raise _broken("lower_groups", f"kernel {s.name} output '{o.name}' has {len(o.index)} loop "
                                              f"variables for rank {len(o.shape)}")


def after_rewrite(optimized: gs.Graph, specs: Sequence[KernelSpec]) -> None:
    known = {t.name for t in optimized.inputs} | {t.name for t in optimized.tensors().values()
                                                  if isinstance(t, gs.Constant)}
    for n in optimized.nodes:
        for t in n.inputs:
            if t.name and t.name not in known:
                raise _broken("rewrite", f"node '{n.name}' ({n.op}) reads '{t.name}' before anything computes it")
        known |= {t.name for t in n.outputs}
    for t in optimized.outputs:
        if t.name not in known:
            raise _broken("rewrite", f"graph output '{t.name}' is computed by no node")
    fused = [n.name for n in optimized.nodes if n.domain == DOMAIN]
    kernels = {s.name for s in specs}
    # a kernel whose outputs all became constants or unread is gone (fuzz replay case000621); none may appear twice
    if len(set(fused)) != len(fused) or not set(fused) <= kernels:
        raise _broken("rewrite", f"Fused nodes {sorted(fused)} are not one each of kernels {sorted(kernels)}")
