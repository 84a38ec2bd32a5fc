"""Operator classes by input -> output mapping type (after DNNFusion and the DP-fusion paper), per node.

- one-to-one: each output element reads one element of each input, same shape (elementwise, Cast, Where, ...);
- broadcast (one-to-many): an input element feeds many output elements (Expand, Tile, broadcasting binary ops,
  generators such as Range and ConstantOfShape);
- reduction (many-to-one): ReduceSum/Mean/Max/Min/Prod, ArgMax/ArgMin, Softmax, LogSoftmax;
- reorganize: views that move elements without computing (Reshape, Transpose, Slice, Squeeze, Concat, Split, ...);
- shuffle: data movement through an index map (Gather with index arrays, GatherElements, ScatterND,
  ScatterElements);
- opaque: everything evonnx leaves to onnxruntime.

The planners derive legality and profitability from these: opaque nodes are barriers; a reduction feeding a
consumer that broadcasts its result makes that consumer recompute it (the cost model prices it).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from evonnx.passes.analyze import Analysis
from evonnx.passes.lower_ops import OPS, MapKind

__all__ = ["MapKind", "classify"]


def classify(node: gs.Node, an: Analysis) -> MapKind:
    lowered = an.lowered.get(node.name)
    d = OPS.get(node.op)
    if not isinstance(lowered, list) or d is None:
        return MapKind.OPAQUE
    if node.op == "Gather":
        ind = an.tensors.get(node.inputs[1].name)
        return MapKind.REORGANIZE if ind is not None and ind.shape == () else MapKind.SHUFFLE
    if d.kind is not MapKind.ONE_TO_ONE:
        return d.kind
    out_shape = lowered[0].shape
    for t in node.inputs:
        info = an.tensors.get(t.name) if t.name else None
        if info is not None and info.shape is not None and info.shape != out_shape and info.shape != ():
            return MapKind.BROADCAST
    return MapKind.ONE_TO_ONE
