"""Min and Max whose zero sign reaches a divisor stay with onnxruntime.

onnxruntime does not define the sign of a zero that Min, Max, ReduceMax or ReduceMin compute from a tie of +0 and
-0: it depends on the element's position (Eigen's SIMD packets return one operand, the scalar tail the other;
`evonnx.model.ZERO_SIGN_UNDEFINED`). The check compares such zeros as equal. But a divisor made of one turns the
sign into the sign of an infinity: Div(t, Slice(Min(c, x))) gave +inf in evonnx's kernel and -inf in
onnxruntime's, at the two elements where the Min met +0 and -0 (fuzz case 359, seed 978007), and the check
refused the model. Such a node is left to onnxruntime, so that every later node, fused or not, divides by
onnxruntime's own zero.

"Reaches" follows every node whose output can carry an input's zero sign (views, arithmetic, Where, odd
functions, ...) and stops at those whose output cannot: comparisons, logic, Abs, Exp, Cos, integer Casts, ....
The divisors are Div's second input, Reciprocal's and Pow's base (+-0 to a negative power is +-inf).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from evonnx import expr as E
from evonnx.model import ZERO_SIGN_UNDEFINED
from evonnx.passes.analyze import Analysis, subgraph_reads

# nodes whose outputs never carry an input's zero sign
_KILLS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not",
                    "IsNaN", "IsInf", "Abs", "Exp", "Cos", "Cosh", "Sigmoid", "Softplus", "Shape", "Size",
                    "ArgMax", "ArgMin", "NonZero", "ReduceL2", "ReduceSumSquare", "ReduceL1", "Softmax"})
# (op, input) pairs where the sign of a zero decides the sign of an infinity
_DIVISORS = {("Div", 1), ("Reciprocal", 0), ("Pow", 0)}


def zero_sign_leaves(g: gs.Graph, an: Analysis) -> dict[str, str]:
    """Float ZERO_SIGN_UNDEFINED nodes whose result reaches a divisor, by name, with the reason to leave them."""
    consumers: dict[str, list[tuple[gs.Node, int]]] = {}
    for n in g.nodes:
        for k, t in enumerate(n.inputs):
            if t.name:
                consumers.setdefault(t.name, []).append((n, k))
        for t in subgraph_reads(n):  # a subgraph's read: whatever its body does with it, as a divisor
            consumers.setdefault(t, []).append((n, -1))
    out: dict[str, str] = {}
    for n in g.nodes:
        if n.op not in ZERO_SIGN_UNDEFINED or not n.outputs:
            continue
        info = an.tensors.get(n.outputs[0].name)
        if info is None or info.dtype not in E.FLOATS + (E.HALF,):
            continue
        if _reaches_divisor(n, consumers, an):
            out[n.name] = (f"{n.op} of floats: onnxruntime's zero from +0 and -0 depends on the position, and it "
                           "reaches a divisor (the sign of an infinity)")
    return out


def _reaches_divisor(start: gs.Node, consumers: dict[str, list[tuple[gs.Node, int]]], an: Analysis) -> bool:
    stack = [t.name for t in start.outputs if t.name]
    seen: set[str] = set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for c, k in consumers.get(t, ()):
            if (c.op, k) in _DIVISORS or k < 0:
                return True
            if c.op in _KILLS:
                continue
            for o in c.outputs:
                info = an.tensors.get(o.name) if o.name else None
                if o.name and (info is None or info.dtype is None or info.dtype in E.FLOATS + (E.HALF,)):
                    stack.append(o.name)
    return False
