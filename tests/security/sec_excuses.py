"""The narrow differences from onnxruntime with its default graph optimizations that are not findings (README):
the decision points a run is cut at to tell a flipped rounding decision from a wrong value (`decision_cuts`,
`cut_model`), and errors raised only by nodes whose values no output reads (`dead_nodes`, `_error_in_dead_node`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

# onnxruntime's memory planner fails a Run with this message where an empty-input reduction's quirk shape (see
# lower_reduce._empty_quirk) differs from the inferred one it planned a re-used buffer for, depending on its plan of
# the whole graph. Its result with buffer re-use off is what onnxruntime computes; the optimized model may match
# that instead of the planner's failure.
from evonnx.excuses import REUSE_ERROR  # noqa: F401 - re-exported to the oracle

# Nodes whose result jumps where a float input crosses a threshold: a float a last-bit apart (evonnx's expf
# against MLAS's exp or logistic) can flip a comparison or move a Cast to int by one. `cut_reference` compares
# such results through the float values they come from.
DECISION_OPS = frozenset({"Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal", "Cast", "Floor", "Ceil",
                          "Round", "Sign", "IsInf", "IsNaN", "ArgMax", "ArgMin", "Mod", "TopK", "NonZero"})
FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The type of every tensor shape inference reaches (an initializer's: its element type and dims)."""
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - an invalid model: no types, no reference from them
        return {}
    g = typed.graph
    types = {v.name: v.type for v in [*g.input, *g.value_info, *g.output]}
    for t in g.initializer:
        types[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types


def decision_cuts(model: onnx.ModelProto) -> list[str]:
    """The float tensors computed by the graph that a decision node (`DECISION_OPS`; a Cast only to a non-float
    type) reads."""
    types = {k: t.tensor_type.elem_type for k, t in _value_types(model).items()}
    produced = {o for n in model.graph.node if n.op_type != "Constant" for o in n.output if o}
    cuts: list[str] = []
    for n in model.graph.node:
        if n.op_type not in DECISION_OPS:
            continue
        if n.op_type == "Cast" and any(a.name == "to" and a.i in FLOAT_TYPES for a in n.attribute):
            continue
        cuts += [i for i in n.input if i in produced and types.get(i) in FLOAT_TYPES and i not in cuts]
    return cuts


def with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """`model` with `names` appended to its graph outputs (after its own, in order)."""
    types = _value_types(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.extend(helper.make_value_info(t, types[t]) for t in names)
    return out


def cut_model(model: onnx.ModelProto, cuts: Sequence[str]) -> tuple[onnx.ModelProto, list[str]]:
    """`model` with every node that reads a tensor of `cuts` reading a new graph input instead; (the model, the
    new inputs' names, in the order of `cuts`). Graph outputs still read the tensors the graph computes."""
    types = _value_types(model)
    taken = {v for n in model.graph.node for v in (*n.input, *n.output)} | {i.name for i in model.graph.input}
    fresh: dict[str, str] = {}
    for k, t in enumerate(cuts):
        name = f"evonnx_cut{k}"
        while name in taken:
            name += "_"
        fresh[t] = name
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for n in out.graph.node:
        for j, i in enumerate(n.input):
            if i in fresh:
                n.input[j] = fresh[i]
    out.graph.input.extend(helper.make_value_info(fresh[t], types[t]) for t in cuts)
    return out, [fresh[t] for t in cuts]


def dead_nodes(model: onnx.ModelProto, values: bool = False) -> set[str]:
    """Names of the nodes none of whose outputs reach a graph output (nor a subgraph); with `values`, also those
    whose outputs reach one only through Shape or Size (their values are never read, only their shapes)."""
    live = {o.name for o in model.graph.output}
    dead = set()
    for n in reversed(model.graph.node):
        if any(o in live for o in n.output) or any(a.type in (5, 10) for a in n.attribute):
            if not (values and n.op_type in ("Shape", "Size")):
                live.update(n.input)
        else:
            dead.add(n.name)
    return dead


# onnxruntime errors that come from values alone, not from shapes: excused in a node whose values nobody reads
VALUE_ERRORS = ("Integer division by zero", "Integer modulo by zero")


def _error_in_dead_node(original_run: dict, err: str | None) -> bool:
    """onnxruntime runs nodes whose results nobody reads, and fails the Run when one of them fails; evonnx, like
    any optimizer, drops such nodes. An error raised only by a dead node is no difference in the outputs. Nor is
    an error from values alone (an integer division by zero) in a node whose values nobody reads, only its shape
    (through Shape or Size): evonnx computes that shape at plan time and drops the node (fuzz seed 150014)."""
    m = re.search(r"running \S+ node\. Name:'", err or "")
    if m is None:
        return False
    rest = (err or "")[m.end():]  # a name may hold quotes itself: try each dead node's full name

    def named(name: str) -> bool:
        if "\0" in name:  # onnxruntime's message ends the name at a NUL (a C string)
            return rest.startswith(name.split("\0")[0])
        return rest.startswith(name + "' Status Message:")

    model = onnx.load(original_run["model"])
    if any(named(name) for name in dead_nodes(model)):
        return True
    return any(e in rest for e in VALUE_ERRORS) and any(named(name) for name in dead_nodes(model, values=True))
