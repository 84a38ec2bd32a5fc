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

from enum import Enum

import onnx_graphsurgeon as gs

from evonnx.passes.analyze import Analysis
from evonnx.passes.lower_ops import REDUCTIONS


class MapKind(Enum):
    ONE_TO_ONE = "one-to-one"
    BROADCAST = "broadcast"
    REDUCTION = "reduction"
    REORGANIZE = "reorganize"
    SHUFFLE = "shuffle"
    OPAQUE = "opaque"


REORGANIZE_OPS = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Concat",
                            "Split", "Shape", "Size"})
BROADCAST_OPS = frozenset({"Expand", "Tile", "Range", "ConstantOfShape"})
SHUFFLE_OPS = frozenset({"ScatterND", "ScatterElements", "GatherElements"})


def classify(node: gs.Node, an: Analysis) -> MapKind:
    lowered = an.lowered.get(node.name)
    if not isinstance(lowered, list):
        return MapKind.OPAQUE
    op = node.op
    if op in REDUCTIONS:
        return MapKind.REDUCTION
    if op in SHUFFLE_OPS:
        return MapKind.SHUFFLE
    if op == "Gather":
        ind = an.tensors.get(node.inputs[1].name)
        scalar = ind is not None and ind.shape == ()
        return MapKind.REORGANIZE if scalar else MapKind.SHUFFLE
    if op in REORGANIZE_OPS:
        return MapKind.REORGANIZE
    if op in BROADCAST_OPS:
        return MapKind.BROADCAST
    out_shape = lowered[0].shape
    for t in node.inputs:
        info = an.tensors.get(t.name) if t.name else None
        if info is not None and info.shape is not None and info.shape != out_shape and info.shape != ():
            return MapKind.BROADCAST
    return MapKind.ONE_TO_ONE
