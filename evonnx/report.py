"""The machine-readable report of one `optimize` run (`--report report.json`).

Keys (README "Report"): nodes_before, nodes_after, kernels, fusion_ratio, bytes_before, bytes_after, groups,
check, plus planner, copies_removed, rejected, folded_by_onnxruntime, cost_model, seconds.

- fusion_ratio = (nodes evonnx could handle that fusion absorbed or folded) / (nodes evonnx could handle), where
  "could handle" means any mapping class other than opaque (`passes/classify.py`), Constant nodes excluded.
- bytes_before / bytes_after: estimated memory traffic of one run at the planning sizes (inputs read plus
  outputs written by every node that touches data; aliasing ops and folded constants count nothing).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import onnx

from evonnx.passes.classify import MapKind, classify
from evonnx.passes.lower_ops import FREE_OPS
from evonnx.passes.pipeline import PipelineResult

if TYPE_CHECKING:  # api imports this module; the result type is only named here
    from evonnx.api import OptimizeResult


def _traffic(nodes: list[tuple[str, list[str]]], nbytes: dict[str, float]) -> float:
    """Bytes read and written by nodes given as (op_type, tensor names touched)."""
    return sum(sum(nbytes.get(t, 0.0) for t in names if t) for op, names in nodes
               if op not in FREE_OPS and op != "Constant")


def build_report(result: OptimizeResult, pipeline: PipelineResult, out_model: onnx.ModelProto,
                 planner: str) -> dict[str, Any]:
    g, an = pipeline.graph, pipeline.analysis
    remaining = {n.name for n in out_model.graph.node}
    candidates = [n for n in g.nodes if n.op != "Constant" and classify(n, an) is not MapKind.OPAQUE]
    absorbed = [n for n in candidates if n.name not in remaining]
    check = None
    if result.check is not None:
        check = {"passed": True, "runs": result.check.runs, "outputs_compared": result.check.compared,
                 "exact": result.check.exact, "max_rel_err": result.check.max_rel_err,
                 "user_sets": result.check.user_sets, "flips": result.check.flips,
                 "skipped": list(result.check.skipped)}
    return {
        "model": str(result.output),
        "library": str(result.library),
        "planner": planner,
        "nodes_before": result.nodes_before,
        "nodes_after": result.nodes_after,
        "kernels": len(result.kernels),
        "fusion_ratio": round(len(absorbed) / len(candidates), 4) if candidates else 0.0,
        "bytes_before": round(_traffic([(n.op, [t.name for t in n.inputs + n.outputs]) for n in g.nodes],
                                       pipeline.stats.nbytes)),
        "bytes_after": round(_traffic([(n.op_type, list(n.input) + list(n.output)) for n in out_model.graph.node],
                                      pipeline.stats.nbytes)),
        "copies_removed": result.plan.copies_removed,
        "groups": [{"kernel": k.name, "nodes": list(k.source_nodes), "ops": list(k.source_ops), "exact": k.exact}
                   for k in result.kernels],
        "rejected": [{"node": r.node, "op": r.op, "reason": r.reason} for r in result.plan.rejected],
        "folded_by_onnxruntime": list(result.folded),
        "check": check,
        "guard": result.guard.as_dict() if result.guard is not None else None,
        "cost_model": asdict(pipeline.cost_model),
        "seconds": round(result.seconds, 3),
    }


def report_json(result: OptimizeResult, pipeline: PipelineResult, out_model: onnx.ModelProto, planner: str) -> str:
    """The report as JSON text; `optimize` stages it with the model and renames both into place together."""
    return json.dumps(build_report(result, pipeline, out_model, planner), indent=1, sort_keys=True) + "\n"
