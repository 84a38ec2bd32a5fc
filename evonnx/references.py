"""Reference models for the check: the original model spelled differently, for the places where onnxruntime's own
result on it depends on something no kernel can reproduce. `as_float64` computes it in float64 (a long float32
sum's rounding in onnxruntime's order); `first_nan_reference` spells its float ReduceMax/ReduceMin with one NaN
rule for every lane (onnxruntime's vectorised reductions let a NaN win or not by its SIMD lane)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from evonnx.model import infer_shapes


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """`model` computed in float64 wherever it computes in float32 (inputs, outputs, initializers, Constant
    values, Cast and ConstantOfShape targets), or None where it holds a subgraph or a custom op. onnxruntime may
    still reject it (an op without a double kernel): the caller then has no float64 reference."""
    if any(n.domain not in ("", "ai.onnx") or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                   for a in n.attribute) for n in model.graph.node):
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    del g.value_info[:]
    f32, f64 = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE
    for vi in [*g.input, *g.output]:
        if vi.type.tensor_type.elem_type == f32:
            vi.type.tensor_type.elem_type = f64

    def widen(t: onnx.TensorProto) -> None:
        if t.data_type == f32:
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t).astype(np.float64), t.name))

    for t in g.initializer:
        widen(t)
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                widen(a.t)
            elif a.type == onnx.AttributeProto.FLOAT and n.op_type == "Constant":
                n.attribute.remove(a)
                n.attribute.append(onnx.helper.make_attribute("value", onnx.helper.make_tensor("v", f64, [], [a.f])))
                break
            elif a.type == onnx.AttributeProto.FLOATS and n.op_type == "Constant":
                vals = list(a.floats)
                n.attribute.remove(a)
                n.attribute.append(onnx.helper.make_attribute("value", onnx.helper.make_tensor("v", f64, [len(vals)],
                                                                                              vals)))
                break
            elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == f32:
                a.i = f64
    _quantizers_in_float32(g)
    return out


def _quantizers_in_float32(g: onnx.GraphProto) -> None:
    """QuantizeLinear and DequantizeLinear, which onnxruntime has no float64 kernels for, fed float32 inputs
    through Casts in `g` (widened by `as_float64`), a DequantizeLinear's output cast back to float64: the values
    the original model computes there (fuzz case 4319 of the long run on 6acdaa3: with no float64 reference, a
    float32 mean that onnxruntime's own sum order puts 1.6e-4 off the exact one refused a kernel that had it)."""
    nodes: list[onnx.NodeProto] = []
    for k, n in enumerate(g.node):
        if n.domain in ("", "ai.onnx") and n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            floats = [0, 1] if n.op_type == "QuantizeLinear" else [1]
            for i in floats:
                if i < len(n.input) and n.input[i]:
                    nodes.append(onnx.helper.make_node("Cast", [n.input[i]], [f"{n.input[i]}__f32_{k}"],
                                                       to=onnx.TensorProto.FLOAT))
                    n.input[i] = f"{n.input[i]}__f32_{k}"
            nodes.append(n)
            if n.op_type == "DequantizeLinear":
                wide = n.output[0]
                n.output[0] = f"{wide}__f32_{k}"
                nodes.append(onnx.helper.make_node("Cast", [n.output[0]], [wide], to=onnx.TensorProto.DOUBLE))
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)


# onnxruntime's float ReduceMax/ReduceMin skip a NaN unless it is the row's first element on their scalar paths
# (`if (out < v) out = v` from element 0), but on their vectorised ones (Eigen's maxCoeff over an innermost axis, its
# rowwise reduction in the middle) whether a NaN wins depends on its SIMD lane and on the row's address. evonnx
# applies the first-element rule everywhere (kernels/cprint.py). Where the outputs differ, the check (and the fuzz
# oracle) compares with onnxruntime on the model with each such reduction spelled out with that rule: the NaN-free
# reduction, then NaN where the first element is NaN. Models without these reductions never get that run.
def first_nan_reference(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """`model` with its float ReduceMax/ReduceMin made lane-independent (see above), or None when it has none (or
    their axes are not constants)."""
    try:
        typed = infer_shapes(model)
    except Exception:  # noqa: BLE001 - an invalid model has no reference of this kind
        return None
    types = {v.name: v.type.tensor_type.elem_type for v in [*typed.graph.value_info, *typed.graph.input]}
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    names = {t for n in model.graph.node for t in [*n.input, *n.output]} | {t.name for t in model.graph.initializer}
    base = "x0ref"
    while any(t.startswith(base) for t in names):  # a model's own names never collide with the added ones
        base += "_"
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    changed = False
    for k, n in enumerate(model.graph.node):
        if n.op_type not in ("ReduceMax", "ReduceMin") or types.get(n.input[0]) not in (1, 10, 11):  # floats
            out.graph.node.append(n)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        axes = attrs.get("axes")
        if len(n.input) > 1 and n.input[1]:
            if n.input[1] not in consts:
                return None
            axes = [int(a) for a in consts[n.input[1]].ravel()]
        if not axes and attrs.get("noop_with_empty_axes", 0):
            out.graph.node.append(n)
            continue
        p, x, y = f"{base}{k}_", n.input[0], n.output[0]
        fill = np.array(-np.inf if n.op_type == "ReduceMax" else np.inf, helper.tensor_dtype_to_np_dtype(types[x]))
        out.graph.initializer.extend([numpy_helper.from_array(fill, p + "fill"),
                                      numpy_helper.from_array(np.array([-1], np.int64), p + "flat"),
                                      numpy_helper.from_array(np.zeros(len(axes or [0]), np.int64), p + "zeros"),
                                      numpy_helper.from_array(np.ones(len(axes or [0]), np.int64), p + "ones"),
                                      numpy_helper.from_array(np.array(axes or [0], np.int64), p + "axes")])
        src = x
        if not axes:  # every axis: the first element of the flattened tensor
            out.graph.node.append(helper.make_node("Reshape", [x, p + "flat"], [p + "flatx"]))
            src = p + "flatx"
        reduced = helper.make_node(n.op_type, [p + "clean", *n.input[1:]], [p + "m"])
        reduced.attribute.extend(n.attribute)
        out.graph.node.extend([
            helper.make_node("IsNaN", [x], [p + "isnan"]),
            helper.make_node("Where", [p + "isnan", p + "fill", x], [p + "clean"]),
            reduced,
            helper.make_node("Slice", [src, p + "zeros", p + "ones", p + "axes"], [p + "first"]),
            helper.make_node("Shape", [p + "m"], [p + "mshape"]),
            helper.make_node("Reshape", [p + "first", p + "mshape"], [p + "first_m"]),
            helper.make_node("IsNaN", [p + "first_m"], [p + "first_nan"]),
            helper.make_node("Where", [p + "first_nan", p + "first_m", p + "m"], [y])])
        changed = True
    return out if changed else None
