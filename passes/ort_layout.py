"""Nodes onnxruntime already runs better than a fused kernel would: planning on top of its own graph optimizations.

onnxruntime's CPU EP (ORT_ENABLE_ALL) rewrites the convolution trunk of a detector before it runs it
(../shared/notes/ort-fusions.md, measured on YOLOv8n, YOLO11n, YOLOv10n and YOLOv8n-seg with onnxruntime 1.31):
- an activation that reads a Conv output is folded into the convolution (FusedConv / NchwcConv with an activation)
  or, for SiLU `x * Sigmoid(x)`, becomes one vectorised QuickGelu;
- convolutions, pooling, Resize, and the Add / Concat / activations between them run in a blocked (NCHWc) layout,
  so a chain Conv -> activation -> Conv needs no layout change. A Fused node in that chain costs a ReorderOutput
  before it and a ReorderInput after it (about 0.1 ms each at 640x640), on top of losing the fused activation:
  fusing the SiLUs of YOLOv8n made the whole model 12-14 % slower;
- a Transpose or a scalar-constant Mul whose only consumer is a MatMul is folded into a FusedMatMul.

So the planner leaves those nodes to onnxruntime (`layout_chain`), and fuses around them: the reshapes,
transposes, decode arithmetic and post-processing that onnxruntime runs node by node. The rules are static (what
onnxruntime's transformers match), so a plan never crosses a blocked-layout chain in the first place; the
measured never-slower guard (`api.optimize`) remains the net for what they miss.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

CONVS = frozenset({"Conv", "ConvTranspose"})
# consumers that read the blocked layout directly
BLOCKED_READERS = frozenset({"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Resize",
                             "Upsample", "BatchNormalization"})
# activations onnxruntime folds into the convolution that produces their input
ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "Elu",
                         "Selu", "Softplus", "ThresholdedRelu", "Gelu"})
# ops that keep a blocked tensor blocked when every data input is blocked
CHAIN = frozenset({"Add", "Sum", "Mul", "Concat", "Max", "Min"}) | ACTIVATIONS
MATMULS = frozenset({"MatMul", "FusedMatMul", "Gemm"})


def _is_const(t: gs.Tensor) -> bool:
    return isinstance(t, gs.Constant) or (bool(t.inputs) and t.inputs[0].op == "Constant")


def _data_inputs(n: gs.Node) -> list[gs.Tensor]:
    return [t for t in n.inputs if t.name and not _is_const(t)]


def _silu_mul(n: gs.Node) -> bool:
    """Mul(x, Sigmoid(x)) in either order."""
    if n.op != "Mul" or len(n.inputs) != 2:
        return False
    a, b = n.inputs
    for x, s in ((a, b), (b, a)):
        if s.inputs and s.inputs[0].op == "Sigmoid" and s.inputs[0].inputs and s.inputs[0].inputs[0] is x:
            return True
    return False


def layout_chain(graph: gs.Graph) -> dict[str, str]:
    """Node name -> why onnxruntime keeps it: activations of convolutions, the blocked-layout chain between
    convolutions, and the Transpose / scale folded into a MatMul. `graph` is toposorted."""
    blocked: set[str] = set()  # tensors onnxruntime keeps in its blocked layout (or could)
    activation: dict[str, str] = {}
    chain: list[gs.Node] = []
    for n in graph.nodes:
        outs = [t.name for t in n.outputs if t.name]
        data = _data_inputs(n)
        if n.op in CONVS:
            blocked.update(outs)
        elif n.op in BLOCKED_READERS - CONVS and data and data[0].name in blocked:
            blocked.update(outs)
        elif n.op in ACTIVATIONS and data and data[0].name in blocked:
            activation[n.name] = (f"left to onnxruntime: a {n.op} of a convolution's output, which onnxruntime "
                                  f"folds into the convolution (or into QuickGelu) in its blocked layout")
            blocked.update(outs)
        elif _silu_mul(n) and all(t.name in blocked for t in data):
            activation[n.name] = ("left to onnxruntime: the Mul of a SiLU on a convolution's output, which "
                                  "onnxruntime runs as one vectorised QuickGelu in its blocked layout")
            blocked.update(outs)
        elif n.op in CHAIN and data and all(t.name in blocked for t in data) and \
                (n.op != "Concat" or n.attrs.get("axis", 0) in (1, -3)):
            chain.append(n)
            blocked.update(outs)
    # a chain node stays with onnxruntime when its output reaches a blocked reader through other chain nodes
    leave = dict(activation)
    feeds_blocked: set[str] = set()
    for n in reversed(chain):
        consumers = [c for t in n.outputs for c in t.outputs]
        if any(c.op in BLOCKED_READERS or c.name in feeds_blocked or c.name in activation for c in consumers):
            feeds_blocked.add(n.name)
            leave[n.name] = (f"left to onnxruntime: a {n.op} between convolutions, which onnxruntime runs in its "
                             f"blocked layout (a kernel there costs a layout reorder on each side)")
    for n in graph.nodes:
        if n.op == "Transpose" or (n.op == "Mul" and any(_is_const(t) for t in n.inputs)):
            consumers = [c for t in n.outputs for c in t.outputs]
            if consumers and all(c.op in MATMULS for c in consumers) and not any(t.name in {
                    o.name for o in graph.outputs} for t in n.outputs):
                if n.op == "Mul" and not _scalar_const(n):
                    continue
                leave.setdefault(n.name, f"left to onnxruntime: a {n.op} that onnxruntime folds into the MatMul "
                                         f"it feeds (FusedMatMul)")
    return leave


def _scalar_const(n: gs.Node) -> bool:
    for t in n.inputs:
        if isinstance(t, gs.Constant) and t.values.size == 1:
            return True
        if t.inputs and t.inputs[0].op == "Constant":
            v = t.inputs[0].attrs.get("value")
            if v is not None and getattr(v, "values", None) is not None and v.values.size == 1:
                return True
    return False
