"""The ordered passes of `evonnx optimize`:
analyze -> analyze_dependences -> plan (greedy `plan_fusion` or `plan_search`) -> lower_groups -> rewrite."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from evonnx.errors import debug_checks
from evonnx.model import default_opset, overridable
from evonnx.passes import contracts
from evonnx.passes.analyze import Analysis, analyze
from evonnx.passes.cost_model import CostModel, NodeStats, calibrate, node_stats
from evonnx.passes.dependences import DepInfo, analyze_dependences
from evonnx.passes.lazy import Reject, naming
from evonnx.passes.lower_gathers import RUNTIME_INDICES, enabled
from evonnx.passes.lower_groups import (
    ill_conditioned_kernels,
    inexact_origins,
    inexact_position_kernels,
    kernels_on_cycle,
    lower_groups,
    overflowing_kernels,
    oversized_kernels,
    without_groups,
)
from evonnx.passes.nms import replace_nms
from evonnx.passes.ort_layout import folded, layout_chain
from evonnx.passes.plan_fusion import plan_fusion
from evonnx.passes.plan_search import DEFAULT_SEARCH, SearchConfig, plan_search
from evonnx.passes.rewrite import rewrite
from evonnx.passes.zero_signs import zero_sign_leaves
from evonnx.records import FusionPlan, KernelSpec

log = logging.getLogger(__name__)

PLANNERS = ("greedy", "search")


@dataclass
class PipelineResult:
    graph: gs.Graph  # the input graph, as imported (toposorted)
    analysis: Analysis
    deps: DepInfo
    stats: NodeStats
    cost_model: CostModel
    plan: FusionPlan
    specs: list[KernelSpec]
    optimized: gs.Graph
    nms: list[str] = field(default_factory=list)  # NonMaxSuppression nodes evonnx's op runs (passes/nms.py)


def without_overridable(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the initializers of its overridable inputs removed, so that every pass sees plain inputs
    (the optimized model gets the defaults back: `api.optimize`)."""
    names = set(overridable(model))
    if not names:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [t for t in out.graph.initializer if t.name not in names]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out


def run_pipeline(model: onnx.ModelProto, *, planner: str = "search", sizes: Mapping[str, int] | None = None,
                 cost_model: CostModel | None = None, cfg: SearchConfig = DEFAULT_SEARCH,
                 leave: Mapping[str, str] | None = None, ort_layout: bool = True, nms: bool = True,
                 runtime_indices: bool | None = None) -> PipelineResult:
    """`leave` maps node names to the reason they stay with onnxruntime (the never-slower guard's choices). With
    `ort_layout`, the nodes onnxruntime's own fusions, blocked layout and constant folding handle better stay with
    it too (`ort_layout.layout_chain`, `ort_layout.folded`). With `nms`, NonMaxSuppression nodes become evonnx's
    (`passes/nms.py`; a CPU op, so not for a CUDA target). With `runtime_indices`, Gathers whose indices are read
    at run time fuse (`lower_gathers`; the CPU kernels only, which fail the Run on a bad index); None: unless
    EVONNX_RUNTIME_INDICES=0 (`lower_gathers.enabled`)."""
    if planner not in PLANNERS:
        raise ValueError(f"planner must be one of {PLANNERS}, not {planner!r}")
    token = RUNTIME_INDICES.set(enabled() if runtime_indices is None else runtime_indices)
    try:
        with naming():  # tables and reduction variables numbered from 0 in every run
            result = _run(model, planner, sizes, cost_model, cfg, leave, ort_layout)
    finally:
        RUNTIME_INDICES.reset(token)
    if nms:
        result.nms = replace_nms(result.optimized, leave)
    return result


def _run(model: onnx.ModelProto, planner: str, sizes: Mapping[str, int] | None, cost_model: CostModel | None,
         cfg: SearchConfig, leave: Mapping[str, str] | None, ort_layout: bool) -> PipelineResult:
    g = gs.import_onnx(without_overridable(model))
    g.toposort()
    an = analyze(g, default_opset(model))
    kept = {**zero_sign_leaves(g, an), **(layout_chain(g) if ort_layout else {}), **(leave or {})}
    for name, reason in kept.items():
        if name in an.lowered:
            an.lowered[name] = Reject(reason)
    if ort_layout:  # after the others: what it leaves depends on which consumers stay with onnxruntime
        for name, reason in folded(g, an).items():
            if name in an.lowered and name not in kept:
                an.lowered[name] = Reject(reason)
    log.info("analyze: %d tensors, %d nodes", len(an.tensors), len(g.nodes))
    checking = debug_checks()
    if checking:
        contracts.after_analyze(g, an)
    deps = analyze_dependences(g, an)
    log.info("dependences: %d storages written through views, %d edges", len(deps.storages), len(deps.edges))
    stats = node_stats(g, an, sizes)
    cm = cost_model if cost_model is not None else (calibrate() if planner == "search" else CostModel())
    if planner == "search":
        plan = plan_search(g, an, deps, stats, cm, cfg=cfg)
    else:
        plan = plan_fusion(g, an, deps, cfg=cfg)
    log.info("%s planner: %d groups, %d nodes left to onnxruntime", planner, len(plan.groups), len(plan.rejected))
    if checking:
        contracts.after_plan(g, an, plan)
    specs, _ = lower_groups(g, plan, an)
    while True:
        if cycle := kernels_on_cycle(g, specs):
            plan = without_groups(plan, g, cycle, "its kernel would read the dims of a tensor computed from the "
                                  "kernel's own outputs (a cycle)")
        elif big := oversized_kernels(specs):
            plan = without_groups(plan, g, big, "its index arithmetic is too large to print (sizes that multiply "
                                  "into polynomials of more than 32768 atoms)")
        elif over := overflowing_kernels(specs):
            plan = without_groups(plan, g, over, "its index arithmetic could overflow int64 at sizes up to 2^40 "
                                  "(a step or bound near 2^63 over a symbolic size)")
        elif ill := ill_conditioned_kernels(specs, origins := inexact_origins(g, an, specs)):
            plan = without_groups(plan, g, ill, "a Mod or a run-time position takes a value it computes inexactly "
                                  "(here or read by another kernel), whose last bit against onnxruntime's can move "
                                  "the remainder by up to the divisor, or pick another element")
        elif picks := inexact_position_kernels(g, an, specs, origins):
            plan = without_groups(plan, g, picks, "an integer computed from a value it computes inexactly (here or "
                                  "read by another kernel) picks positions in onnxruntime, where its last bit against "
                                  "onnxruntime's picks other elements")
        else:
            break
        specs, _ = lower_groups(g, plan, an)
    log.info("lower_groups: %d kernels", len(specs))
    if checking:
        contracts.after_lower(g, plan, specs)
    optimized = rewrite(g, specs, an)
    if checking:
        contracts.after_rewrite(optimized, specs)
    return PipelineResult(g, an, deps, stats, cm, plan, specs, optimized)
