"""What one `optimize` run tells its caller: `OptimizeResult` (with the guard's `GuardResult`), its one-screen
summary, and the machine-readable report (`--report report.json`).

Keys (README "Report"): nodes_before, nodes_after, kernels, fusion_ratio, bytes_before, bytes_after, groups,
check, plus planner, copies_removed, rejected, folded_by_onnxruntime, cost_model, seconds.

- fusion_ratio = (nodes evonnx could handle that fusion absorbed or folded) / (nodes evonnx could handle), where
  "could handle" means any mapping class other than opaque (`passes/classify.py`), Constant nodes excluded.
- bytes_before / bytes_after: estimated memory traffic of one run at the planning sizes (inputs read plus
  outputs written by every node that touches data; aliasing ops and folded constants count nothing).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx

from evonnx.blame import blamed_kernel
from evonnx.measure import Comparison
from evonnx.passes.classify import MapKind, classify
from evonnx.passes.lower_ops import FREE_OPS
from evonnx.passes.pipeline import PipelineResult
from evonnx.records import FusionPlan, KernelSpec
from evonnx.verify import CheckResult


@dataclass
class GuardResult:
    """What the never-slower guard measured (`evonnx.measure.compare_models`) and left to onnxruntime."""

    comparisons: list[Comparison]  # the final model against the original, per thread count
    dropped: list[tuple[str, int, str]] = field(default_factory=list)  # (what, kernels, the measurement before)
    note: str = ""
    # kernels a tie below 1.0x tried leaving to onnxruntime and kept: (what, kernels, why they stayed)
    declined: list[tuple[str, int, str]] = field(default_factory=list)

    def __str__(self) -> str:
        if self.note:
            return self.note
        text = "; ".join(str(c) for c in self.comparisons) or "no kernel kept: the model is written as the original"
        for what, n, before in self.dropped:
            text += f"; left {what} ({n}) to onnxruntime after {before}"
        for what, n, why in self.declined:
            text += f"; kept {what} ({n}): {why}"
        return text

    def as_dict(self) -> dict[str, object]:
        return {"comparisons": [c.as_dict() for c in self.comparisons], "note": self.note,
                "dropped": [{"what": w, "kernels": n, "measured_before": b} for w, n, b in self.dropped],
                "kept_after_trial": [{"what": w, "kernels": n, "why": y} for w, n, y in self.declined]}


@dataclass
class OptimizeResult:
    output: Path
    library: Path
    nodes_before: int
    nodes_after: int
    kernels: list[KernelSpec]
    plan: FusionPlan
    check: CheckResult | None
    seconds: float
    guard: GuardResult | None = None
    # nodes of the model as written that onnxruntime folds or fuses at session start (constant folding, Conv+BN):
    # planned on the graph onnxruntime runs, they are neither fused nor left
    folded: list[str] = field(default_factory=list)
    nms: list[str] = field(default_factory=list)  # NonMaxSuppression nodes evonnx's op runs (passes/nms.py)

    def summary(self) -> str:
        copies = (f", {self.plan.copies_removed} full-tensor copies of scatter writes removed"
                  if self.plan.copies_removed else "")
        lines = [f"{self.output}: {self.nodes_before} nodes -> {self.nodes_after} "
                 f"({len(self.kernels)} fused kernels{copies}); library {self.library}"]
        for k in self.kernels:
            ops: dict[str, int] = {}
            for op in k.source_ops:
                ops[op] = ops.get(op, 0) + 1
            absorbed = ", ".join(f"{op}x{n}" if n > 1 else op for op, n in sorted(ops.items()))
            lines.append(f"  {k.name}: {len(k.source_ops)} nodes -> 1 [{absorbed}]"
                         f"{' exact' if k.exact else ''}")
        if self.nms:
            lines.append(f"  {len(self.nms)} NonMaxSuppression run by evonnx's op: {', '.join(self.nms)[:200]}")
        if self.folded:
            lines.append(f"  {len(self.folded)} nodes folded by onnxruntime itself at session start")
        by_check: dict[str, int] = {}  # nodes the check left to onnxruntime (a kernel differed), by kernel
        for r in self.plan.rejected:
            if (kernel := blamed_kernel(r.reason)) is not None:
                by_check[kernel] = by_check.get(kernel, 0) + 1
        for kernel, n in by_check.items():
            lines.append(f"  {n} nodes left to onnxruntime: kernel {kernel}, made of them, differed from onnxruntime "
                         f"at the check (the report's 'rejected' says where)")
        check = "skipped (--no-check)" if self.kernels or self.nms else "none needed (no kernel: the original runs)"
        lines.append(f"  check: {self.check if self.check is not None else check}")
        lines.append(f"  guard: {self.guard if self.guard is not None else 'skipped (--no-guard)'}")
        lines.append(f"  time: {self.seconds:.2f} s")
        return "\n".join(lines)


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
                 "skipped": list(result.check.skipped), "cpu_variants": list(result.check.variants),
                 "variant_bug": result.check.variant_bug or None}
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
        "nms": list(result.nms),
        "check": check,
        "guard": result.guard.as_dict() if result.guard is not None else None,
        "cost_model": asdict(pipeline.cost_model),
        "seconds": round(result.seconds, 3),
    }


def report_json(result: OptimizeResult, pipeline: PipelineResult, out_model: onnx.ModelProto, planner: str) -> str:
    """The report as JSON text; `optimize` stages it with the model and renames both into place together."""
    return json.dumps(build_report(result, pipeline, out_model, planner), indent=1, sort_keys=True) + "\n"
