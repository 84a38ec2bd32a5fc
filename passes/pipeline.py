"""The ordered passes of `evonnx optimize`: analyze -> analyze_dependences -> plan_fusion -> lower_groups -> rewrite."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx
import onnx_graphsurgeon as gs

from evonnx.model import default_opset
from evonnx.passes.analyze import Analysis, analyze
from evonnx.passes.dependences import DepInfo, analyze_dependences
from evonnx.passes.lazy import reset_names
from evonnx.passes.lower_groups import lower_groups
from evonnx.passes.plan_fusion import Config, plan_fusion
from evonnx.passes.rewrite import rewrite
from evonnx.records import FusionPlan, KernelSpec

log = logging.getLogger(__name__)

PASSES = ("analyze", "analyze_dependences", "plan_fusion", "lower_groups", "rewrite")


@dataclass
class PipelineResult:
    graph: gs.Graph  # the input graph, as imported (toposorted)
    analysis: Analysis
    deps: DepInfo
    plan: FusionPlan
    specs: list[KernelSpec]
    optimized: gs.Graph


def run_pipeline(model: onnx.ModelProto, *, cfg: Config = Config()) -> PipelineResult:
    reset_names()
    g = gs.import_onnx(model)
    g.toposort()
    an = analyze(g, default_opset(model))
    log.info("analyze: %d tensors, %d nodes", len(an.tensors), len(g.nodes))
    deps = analyze_dependences(g, an)
    log.info("dependences: %d storages written through views, %d edges", len(deps.storages), len(deps.edges))
    plan = plan_fusion(g, an, deps, cfg=cfg)
    log.info("plan_fusion: %d groups, %d nodes left to onnxruntime", len(plan.groups), len(plan.rejected))
    specs, _ = lower_groups(g, plan, an)
    log.info("lower_groups: %d kernels", len(specs))
    optimized = rewrite(g, specs, an)
    return PipelineResult(g, an, deps, plan, specs, optimized)
