"""`evonnx explain`: what optimize would fuse, summary first.

The summary names each kernel and what it absorbs, then what stays with onnxruntime grouped by reason. `-v` adds a
verdict per node of the model as written, the dependences of writes through views and what each kernel output
reads; `--json` gives the same as one JSON object. Planning is optimize's own: on the graph onnxruntime runs after
its session-start folding (`EVONNX_ORT_FOLD=0`: the graph as written), without the check or the guard.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evonnx.model import load_model
from evonnx.passes.ort_layout import fold_like_onnxruntime
from evonnx.passes.pipeline import PipelineResult, run_pipeline
from evonnx.records import KernelSpec

# verdicts of a node of the model as written
FUSED = "fused"  # computed by a kernel
INLINED = "inlined"  # a constant or plan-time value, folded into the kernels or nodes that read it
FOLDED = "folded by onnxruntime"  # removed or fused by onnxruntime's basic optimizations at session start
LEFT = "left to onnxruntime"
NMS = "run by evonnx's NonMaxSuppression op"  # passes/nms.py


@dataclass
class NodeVerdict:
    name: str
    op: str
    verdict: str
    detail: str  # the kernel, or the reason


@dataclass
class KernelSummary:
    name: str
    ops: dict[str, int]  # op type -> nodes absorbed
    exact: bool
    inputs: int
    outputs: list[str]  # "name dtype[shape] reads ..."


@dataclass
class Explanation:
    model: str
    nodes_as_written: int
    nodes_planned: int  # after onnxruntime's session-start folding
    kernels: list[KernelSummary] = field(default_factory=list)
    nodes: list[NodeVerdict] = field(default_factory=list)
    dependences: list[str] = field(default_factory=list)
    nms: list[str] = field(default_factory=list)  # NonMaxSuppression nodes evonnx's op runs, subgraphs included

    def text(self, verbose: bool = False) -> str:
        count = Counter(n.verdict for n in self.nodes)
        folded = f"; onnxruntime's session-start folding leaves {self.nodes_planned}" \
            if self.nodes_planned != self.nodes_as_written else ""
        lines = [f"{self.model}: {self.nodes_as_written} nodes{folded}",
                 f"{len(self.kernels)} fused kernels absorb {count[FUSED]} nodes"
                 + (":" if self.kernels else "")]
        for k in self.kernels:
            absorbed = ", ".join(f"{op}x{n}" if n > 1 else op for op, n in sorted(k.ops.items()))
            lines.append(f"  {k.name}: {sum(k.ops.values())} nodes [{absorbed}]{' exact' if k.exact else ''}")
        if self.nms:
            lines.append(f"{len(self.nms)} NonMaxSuppression run by evonnx's op (CPU): {', '.join(self.nms)[:200]}")
        if count[INLINED]:
            lines.append(f"{count[INLINED]} nodes are constants or values known at plan time, folded into what reads "
                         "them")
        if count[FOLDED]:
            lines.append(f"{count[FOLDED]} nodes are folded or fused by onnxruntime itself at session start")
        left = [n for n in self.nodes if n.verdict == LEFT]
        lines.append(f"{len(left)} nodes left to onnxruntime" + (", by reason:" if left else ""))
        by_reason: dict[str, list[NodeVerdict]] = {}
        for n in left:
            by_reason.setdefault(n.detail, []).append(n)
        for reason, ns in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            ops = Counter(n.op for n in ns)
            lines.append(f"  {len(ns)} ({', '.join(f'{op}x{c}' if c > 1 else op for op, c in sorted(ops.items()))}):"
                         f" {reason}")
        if not verbose:
            return "\n".join(lines)
        lines.append("nodes:")
        lines += [f"  {n.name} ({n.op}): {n.verdict}{': ' + n.detail if n.detail else ''}" for n in self.nodes]
        lines.append("dependences (writes through views):")
        lines += ["  " + d for d in self.dependences]
        for k in self.kernels:
            lines.append(f"kernel {k.name}: {k.inputs} inputs, {len(k.outputs)} outputs{', exact' if k.exact else ''}")
            lines += ["  " + o for o in k.outputs]
        return "\n".join(lines)

    def json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def explain(path: str | Path) -> Explanation:
    written = load_model(path)
    model = written
    if os.environ.get("EVONNX_ORT_FOLD", "1") != "0":
        model = fold_like_onnxruntime(load_model(path, infer=False)) or written  # as `optimize` folds
    result = run_pipeline(model)
    out = Explanation(str(path), len(written.graph.node), len(model.graph.node))
    out.kernels = [_kernel(s) for s in result.specs]
    out.dependences = result.deps.describe().splitlines()
    out.nms = list(result.nms)
    planned = _verdicts(result)
    for n in written.graph.node:
        v = planned.get(n.name)
        out.nodes.append(v if v is not None else NodeVerdict(n.name, n.op_type, FOLDED, ""))
    return out


def _kernel(s: KernelSpec) -> KernelSummary:
    return KernelSummary(s.name, dict(Counter(s.source_ops)), s.exact, len(s.inputs),
                         [f"{o.name} {o.dtype}[{', '.join(map(str, o.shape))}] reads {'; '.join(o.reads)}"
                          for o in s.outputs])


def _verdicts(result: PipelineResult) -> dict[str, NodeVerdict]:
    """A verdict for every node of the planned graph, by name."""
    live = {n: s.name for s in result.specs for n in s.source_nodes}
    grouped = {n for g in result.plan.groups for n in g.nodes}
    kept = {n.name for n in result.optimized.nodes}
    reasons = {r.node: r.reason for r in result.plan.rejected}
    out = {}
    for n in result.graph.nodes:
        if n.name in live:
            v = NodeVerdict(n.name, n.op, FUSED, live[n.name])
        elif n.name in result.nms:
            v = NodeVerdict(n.name, n.op, NMS, "")
        elif n.name in grouped and n.name not in kept:
            v = NodeVerdict(n.name, n.op, INLINED, "its values are computed inside the kernels that read them")
        elif n.name in grouped:
            v = NodeVerdict(n.name, n.op, LEFT, "constant only: onnxruntime computes it once at session start")
        elif "(folded into its consumers)" in reasons.get(n.name, "") and n.name not in kept:
            v = NodeVerdict(n.name, n.op, INLINED, reasons[n.name].replace(" (folded into its consumers)", ""))
        elif "(folded into its consumers)" in reasons.get(n.name, ""):
            v = NodeVerdict(n.name, n.op, LEFT, "a constant or plan-time value that nodes left to onnxruntime read")
        else:
            v = NodeVerdict(n.name, n.op, LEFT, reasons.get(n.name, "no reason recorded"))
        out[n.name] = v
    return out
