"""`evonnx explain`: node by node, which kernel absorbs it or why onnxruntime keeps it."""

from __future__ import annotations

from pathlib import Path

from evonnx.model import load_model


def explain(path: str | Path) -> str:
    from evonnx.passes.pipeline import run_pipeline

    result = run_pipeline(load_model(path))
    kernel_of = {n: g.name for g in result.plan.groups for n in g.nodes}
    live = {s.name for s in result.specs}
    reasons = {r.node: r.reason for r in result.plan.rejected}
    lines = [f"{path}: {len(result.graph.nodes)} nodes, {len(result.specs)} fused kernels"]
    for n in result.graph.nodes:
        k = kernel_of.get(n.name)
        if k is not None and k in live:
            verdict = f"fused into {k}"
        elif k is not None:
            verdict = f"dropped: nothing reads the outputs of {k} after fusion"
        else:
            verdict = f"left to onnxruntime: {reasons.get(n.name, 'unknown')}"
        lines.append(f"  {n.name} ({n.op}): {verdict}")
    lines.append("dependences (writes through views):")
    lines.extend("  " + line for line in result.deps.describe().splitlines())
    for s in result.specs:
        lines.append(f"kernel {s.name}: {len(s.inputs)} inputs, {len(s.outputs)} outputs"
                     f"{', exact' if s.exact else ''}")
        for o in s.outputs:
            lines.append(f"  {o.name} {o.dtype}[{', '.join(map(str, o.shape))}] reads {'; '.join(o.reads)}")
    return "\n".join(lines)
