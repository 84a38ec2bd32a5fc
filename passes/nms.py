"""NonMaxSuppression to `ai.evonnx::NonMaxSuppression` (issue 14).

Every ONNX NonMaxSuppression that onnxruntime would run on the CPU becomes the evonnx op of the same name, with the
same inputs, attribute and output: `kernels/runtime/evonnx_nms.h` selects exactly the boxes onnxruntime 1.31's CPU
kernel selects, in the same order, with a sort instead of a priority queue, a grid instead of comparing every
candidate with every kept box, and the (batch, class) pairs in parallel on onnxruntime's pool. The op needs no
generated code; every model library carries it.

Left to onnxruntime: a node the never-slower guard leaves, a `center_point_box` other than 0 or 1 (onnxruntime
refuses the session, and so must the optimized model), and any node when the kernels are built for CUDA (the op
runs on the CPU only; onnxruntime has a CUDA NonMaxSuppression).
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx_graphsurgeon as gs

from evonnx.model import DOMAIN

NMS_OP = "NonMaxSuppression"


def replace_nms(g: gs.Graph, leave: Mapping[str, str] | None = None) -> list[str]:
    """Turns the NonMaxSuppression nodes of `g` and of the If/Loop/Scan bodies in it, at any depth, into evonnx's
    (in place); returns their names. torchvision's batched NMS sits in an If branch. Only the op's domain changes,
    so what a body captures stays as it was."""
    replaced = []
    for n in g.nodes:
        for value in n.attrs.values():
            for body in value if isinstance(value, list) else [value]:
                if isinstance(body, gs.Graph):
                    replaced += replace_nms(body, leave)
        if n.op != NMS_OP or n.domain not in (None, "", "ai.onnx") or (leave and n.name in leave):
            continue
        box = n.attrs.get("center_point_box", 0)
        if not isinstance(box, int) or box not in (0, 1) or len(n.inputs) > 5 or len(n.outputs) != 1:
            continue
        n.domain = DOMAIN
        replaced.append(n.name)
    return replaced
