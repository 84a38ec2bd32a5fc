"""Hypothesis strategies for small ONNX graphs made of the ops evonnx fuses, with adversarial text and sizes.

`cases(canary)` draws a `Case`: a model of 2 to 8 op steps (Add/Sub/Mul/Div/Min/Max/Neg/Abs/Exp/Sigmoid/Where/
the activations of `FLOAT_ACTIVATIONS` (Clip, Pow, LeakyRelu, HardSigmoid, Tanh, ... with their attributes)/
Cast/compare, Slice with negative and huge bounds and steps, Gather with constant (negative, scalar) indices,
Transpose, Reshape with 0/-1, Unsqueeze/Squeeze, Concat, Expand, ScatterND with constant indices, ReduceSum/Max,
Range, Shape, and `sec_more_steps`' Split/Tile/Flatten/ScatterElements/variadic Sum/Mean/And/Or/Xor/the other
reductions/LogSoftmax/ConstantOfShape/Size, `sec_flow_steps`' If/Loop whose bodies capture outer tensors and
`sec_quant_steps`' QDQ pairs and DequantizeLinear'd weights)
over float32/float16/float64/int64/int32/int8/uint8 inputs with symbolic and static dims (0, 1, large), integer
extremes in constants, plus the sizes each symbolic dim takes at run time (0, 1, 2 and a larger one; pairs of
symbols also at unequal sizes, one of them 1). With `adversarial`,
most names (tensors, nodes, initializers, dim_params, graph, doc strings, attribute doc strings, metadata, the
output file name) are payloads from `sec_payloads`.

Shapes are tracked symbolically while building (a dim is an int, a symbol, or an opaque token for a size only
known at run time) so that most graphs run; those that do not at some size are still cases: then onnxruntime's
error is the expected behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from sec_cases import (
    DTYPES,
    FLOAT_VALUES,
    I32_MAX,
    I32_MIN,
    I64_MAX,
    I64_MIN,
    INEXACT_OPS,
    INT_EXTREMES,
    Case,
    Dim,
    Tensor,
    _plan_elements,
    _static,
    broadcast,
)
from sec_flow_steps import FLOW_STEPS, FlowSteps, read_names
from sec_more_steps import MORE_INEXACT, MORE_STEPS, MoreSteps
from sec_payloads import PLAIN_ODD, TEMPLATES, Canary, file_name_templates, payload
from sec_quant_steps import QUANT_STEPS, QuantSteps
from sec_steps import ViewSteps

# float elementwise ops beyond the common ones, each run by onnxruntime's CPU EP in float32 and float16 at
# opsets 13 to 20 (measured on 1.31)
FLOATS = ("float32", "float16", "float64")
FLOAT_ACTIVATIONS = ("Floor", "Ceil", "Round", "Sqrt", "Reciprocal", "Relu", "Sign", "Log", "Tanh", "Erf", "Sin",
                     "Cos", "IsNaN", "Softplus", "LeakyRelu", "HardSigmoid", "Clip", "Pow", "Mish")


# -- names ------------------------------------------------------------------------------------------------------
class Names:
    """Unique names: plain (`t3`) or, for adversarial cases, a payload with a unique suffix."""

    def __init__(self, draw: Callable, canary: Canary, adversarial: bool):
        self.draw, self.canary, self.adversarial = draw, canary, adversarial
        self.count = 0
        self.canaries: list[str] = []

    def __call__(self, kind: str, *, allow_nul: bool = False) -> str:
        self.count += 1
        k = self.count
        plain = f"{kind}{k}"
        if not self.adversarial or not self.draw(st.booleans()):
            return plain
        choice = self.draw(st.integers(0, len(TEMPLATES) + len(PLAIN_ODD) - 1 + int(allow_nul)))
        if choice < len(TEMPLATES):
            self.canaries.append(self.canary.identifier(k))
            return payload(self.canary, TEMPLATES[choice][1], k) + f"#{kind}{k}"
        if choice < len(TEMPLATES) + len(PLAIN_ODD):
            return PLAIN_ODD[choice - len(TEMPLATES)] + f"#{kind}{k}"
        self.canaries.append(self.canary.identifier(k))
        return f"a\0{payload(self.canary, TEMPLATES[0][1], k)}#{kind}{k}"


# -- the builder --------------------------------------------------------------------------------------------------
class Builder(ViewSteps, MoreSteps, FlowSteps, QuantSteps):
    """Draws a graph step by step: the elementwise steps here, the views, writes, reductions and generators in
    `sec_steps.ViewSteps`, the rest of the ops evonnx lowers in `sec_more_steps.MoreSteps`, If and Loop over
    captured tensors in `sec_flow_steps.FlowSteps`, QuantizeLinear/DequantizeLinear in `sec_quant_steps`."""

    def __init__(self, draw: Callable, names: Names, opset: int):
        self.draw, self.names, self.opset = draw, names, opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[Tensor] = []
        self.pool: list[Tensor] = []
        self.unknown = 0
        self.ops_used: set[str] = set()
        self.consts: dict[str, np.ndarray] = {}  # each constant's value, by name

    # basic pieces
    def fresh_dim(self) -> str:
        self.unknown += 1
        return f"?{self.unknown}"

    def node(self, op: str, inputs: Sequence[str], n_out: int = 1, **attrs: object) -> list[str]:
        if self.opset < 13 and op in ("Squeeze", "Unsqueeze", "ReduceSum", "Split") and len(inputs) == 2 \
                and inputs[1] in self.consts:
            # opsets 11 and 12 take axes (and Split's sizes) as attributes, as mmdeploy's exports have them
            attrs[{"Split": "split"}.get(op, "axes")] = self.consts[inputs[1]].tolist()
            inputs = inputs[:1]
        if self.opset < 12:  # LessOrEqual/GreaterOrEqual and ArgMax's select_last_index came with opset 12
            op = {"LessOrEqual": "Less", "GreaterOrEqual": "Greater"}.get(op, op)
            attrs.pop("select_last_index", None)
        outs = [self.names("t") for _ in range(n_out)]
        node = helper.make_node(op, list(inputs), outs, name=self.names("n", allow_nul=True), **attrs)
        if self.names.adversarial and self.draw(st.booleans()):
            node.doc_string = self.names("doc", allow_nul=True)
            for a in node.attribute:
                a.doc_string = self.names("attrdoc", allow_nul=True)
        self.nodes.append(node)
        self.ops_used.add(op)
        return outs

    def add(self, name: str, dtype: str, shape: Sequence[Dim]) -> Tensor:
        t = Tensor(name, dtype, tuple(shape))
        self.pool.append(t)
        return t

    def const(self, array: np.ndarray) -> str:
        """A constant: an initializer or a Constant node (drawn)."""
        name = self.names("c")
        self.consts[name] = array
        tensor = numpy_helper.from_array(array, name)
        if self.names.adversarial and self.draw(st.booleans()):
            tensor.doc_string = self.names("cdoc", allow_nul=True)
        if self.draw(st.booleans()):
            # the value as a tensor (the exporters), or in the typed attributes other tools write (value_ints ...)
            typed = {("int64", 0): "value_int", ("int64", 1): "value_ints", ("float32", 0): "value_float",
                     ("float32", 1): "value_floats"}.get((str(array.dtype), array.ndim))
            if (array.ndim == 1 and not array.size) or self.opset < 12:  # an empty list has no attribute
                typed = None  # type; the typed attributes came with opset 12
            attrs = {typed: array.tolist()} if typed and self.draw(st.booleans()) else {"value": tensor}
            self.nodes.append(helper.make_node("Constant", [], [name], name=self.names("n", allow_nul=True),
                                               **attrs))
        else:
            self.initializers.append(tensor)
        return name

    def i64(self, values: Sequence[int]) -> str:
        return self.const(np.array(values, dtype=np.int64))

    def values(self, dtype: str, shape: Sequence[int]) -> np.ndarray:
        """Constant values with extremes (int) or special floats."""
        n = math.prod(shape)
        if dtype in FLOATS:  # FLOAT_VALUES' 1e30 and 1e-40 are inf and 0 in float16
            vals = self.draw(st.lists(st.one_of(st.sampled_from(FLOAT_VALUES),
                                                st.floats(-8, 8, width=32, allow_nan=False)), min_size=n, max_size=n))
            with np.errstate(over="ignore"):  # to infinity in float16, as meant
                return np.array(vals, dtype=np.float32).astype(dtype).reshape(shape)
        if dtype == "bool":
            return np.array(self.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool).reshape(shape)
        low = 0 if dtype.startswith("u") else -9
        vals = self.draw(st.lists(st.one_of(st.sampled_from(INT_EXTREMES[dtype]), st.integers(low, 9)),
                                  min_size=n, max_size=n))
        return np.array(vals, dtype=dtype).reshape(shape)

    def pick(self, pred: Callable[[Tensor], bool], what: str) -> Tensor | None:
        """A pool tensor satisfying `pred` (`what` names the operand, for a reader): often the latest one, so that
        chains form and fuse."""
        cands = [t for t in reversed(self.pool) if pred(t)]
        if not cands:
            return None
        if self.draw(st.booleans()):  # chains fuse
            return cands[0]
        return self.draw(st.sampled_from(cands))

    def numeric(self, t: Tensor) -> bool:
        """Whether onnxruntime's CPU EP has arithmetic for `t` (not for bool, nor for most ops on 8-bit integers,
        which views, Cast, Abs, Sign and Clip take)."""
        return t.dtype not in ("bool", "int8", "uint8")

    def small(self, t: Tensor) -> bool:
        return t.rank <= 4

    # op steps: each returns False when the pool has nothing it applies to
    def step_activation(self) -> bool:
        return self.pick(lambda t: t.dtype in ("float32", "float16"), "activation x") is not None and \
            self.step_unary(activation=True)

    def step_unary(self, activation: bool = False) -> bool:
        x = self.pick(lambda t: not activation or t.dtype in ("float32", "float16"), "unary x")
        assert x is not None
        if activation:
            op = "Activation"
        elif x.dtype == "bool":
            op = self.draw(st.sampled_from(["Not", "Cast"]))
        elif x.dtype in FLOATS:
            op = self.draw(st.sampled_from(["Neg", "Abs", "Exp", "Sigmoid", "Cast", "Activation", "Activation"]
                                           + (["HardSwish"] if self.opset >= 14 and x.dtype != "float64" else [])))
        elif x.dtype in ("int8", "uint8"):
            op = self.draw(st.sampled_from(["Abs", "Cast", "Cast", "Sign", "Clip"]))
        else:
            op = self.draw(st.sampled_from(["Neg", "Abs", "Cast", "Sign", "Clip"]))
        if op == "Activation":  # the rest of the elementwise ops evonnx lowers (passes/lower_math.py)
            op = self.draw(st.sampled_from(FLOAT_ACTIVATIONS))
        if op == "Mish":  # Softplus -> Tanh -> Mul(x, .) in either order: one op in evonnx (lower_math._mish)
            (sp,) = self.node("Softplus", [x.name])
            (th,) = self.node("Tanh", [sp])
            (y,) = self.node("Mul", [x.name, th] if self.draw(st.booleans()) else [th, x.name])
            self.add(y, x.dtype, x.shape)
            return True
        if op == "Cast":
            to = self.draw(st.sampled_from(["float32", "int64", "int32", "float16", "float64", "uint8", "int8",
                                            "bool"]))
            (y,) = self.node("Cast", [x.name], to=DTYPES[to])
            self.add(y, to, x.shape)
            return True
        ins, attrs = [x.name], {}
        if op == "Clip":  # scalar bounds, either or both missing, lower above upper allowed
            ins += [self.const(self.values(x.dtype, [])) if self.draw(st.booleans()) else "" for _ in range(2)]
            while ins and ins[-1] == "":
                ins.pop()
        elif op == "Pow":  # the exponents onnxruntime special-cases and some it does not
            ins.append(self.const(np.array(self.draw(st.sampled_from([1.0, 2.0, 3.0, 0.5, -1.0, 0.0, 2.5])),
                                           dtype=self.draw(st.sampled_from([x.dtype, "float32"])))))
        elif op == "LeakyRelu" and self.draw(st.booleans()):
            attrs["alpha"] = self.draw(st.sampled_from([0.1, -2.0, 1.0 / 3.0]))
        elif op == "HardSigmoid" and self.draw(st.booleans()):
            attrs = {"alpha": self.draw(st.sampled_from([0.2, 1.0 / 6.0, -1.0])),
                     "beta": self.draw(st.sampled_from([0.5, 0.0, 3.0]))}
        (y,) = self.node(op, ins, **attrs)
        self.add(y, "bool" if op == "IsNaN" else x.dtype, x.shape)
        return True

    def partner(self, x: Tensor, *, nonzero: bool = False) -> tuple[str, tuple[Dim, ...]]:
        """A second operand broadcasting with `x`: a pool tensor or a constant."""
        allow_sym = self.draw(st.integers(0, 3)) == 0
        if not nonzero and self.draw(st.booleans()):
            y = self.pick(lambda t: t.dtype == x.dtype and broadcast(x.shape, t.shape, allow_sym) is not None
                          and t.rank <= 4, "partner")
            if y is not None:
                out = broadcast(x.shape, y.shape, allow_sym)
                assert out is not None
                return y.name, out
        form = self.draw(st.sampled_from(["scalar", "suffix", "lead"]))
        if form == "scalar" or x.rank == 0:
            shape: list[int] = []
        else:
            k = self.draw(st.integers(1, x.rank))
            shape = [d if isinstance(d, int) and d <= 8 else 1 for d in x.shape[x.rank - k:]]
            if form == "lead" and k == x.rank and len(shape) < 4:
                shape = [self.draw(st.sampled_from([1, 2]))] + shape
        if nonzero:
            n = math.prod(shape)
            choices = [1, 2, 3, 7, -2, -3, I32_MAX] + ([I64_MAX, I64_MIN] if x.dtype == "int64" else [I32_MIN])
            vals = self.draw(st.lists(st.sampled_from(choices), min_size=n, max_size=n))
            arr = np.array(vals, dtype=x.dtype).reshape(shape)
        else:
            arr = self.values(x.dtype, shape)
        out = broadcast(x.shape, shape)
        assert out is not None
        return self.const(arr), out

    def step_binary(self) -> bool:
        x = self.pick(lambda t: self.numeric(t) and self.small(t), "binary x")
        if x is None:
            return False
        op = self.draw(st.sampled_from(["Add", "Sub", "Mul", "Div", "Min", "Max", "Mod"]))
        floats = FLOATS
        attrs = {"fmod": 1} if op == "Mod" and x.dtype in floats else {}  # fmod=0 is for integers only
        divides = op in ("Div", "Mod") and x.dtype not in floats
        # an integer divisor that is a run-time tensor may hold 0 (onnxruntime fails the Run: issue 16)
        runtime_divisor = divides and self.draw(st.booleans())
        other, shape = self.partner(x, nonzero=divides and not runtime_divisor)
        if runtime_divisor:
            ins = [other, x.name]
        else:
            ins = [x.name, other] if divides or self.draw(st.booleans()) else [other, x.name]
        (y,) = self.node(op, ins, **attrs)
        self.add(y, x.dtype, shape)
        return True

    def step_symbol_broadcast(self) -> bool:
        """A binary op between two tensors whose dims are different symbols on some axis (onnxruntime accepts
        either being 1, or both equal)."""
        pairs = [(x, y) for x in reversed(self.pool) for y in reversed(self.pool)
                 if x.dtype == y.dtype and x.dtype != "bool" and broadcast(x.shape, y.shape) is None
                 and broadcast(x.shape, y.shape, True) is not None]
        if not pairs:
            return False
        x, y = self.draw(st.sampled_from(pairs[:8]))
        op = self.draw(st.sampled_from(["Add", "Mul", "Max", "Sub"]))
        (out,) = self.node(op, [x.name, y.name])
        shape = broadcast(x.shape, y.shape, True)
        assert shape is not None
        self.add(out, x.dtype, shape)
        return True

    def step_compare_where(self) -> bool:
        x = self.pick(lambda t: self.numeric(t) and self.small(t), "where x")
        if x is None:
            return False
        op = self.draw(st.sampled_from(["Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"]))
        other, cshape = self.partner(x)
        (c,) = self.node(op, [x.name, other])
        cond = self.add(c, "bool", cshape)
        if not self.draw(st.booleans()):
            return True
        other2, shape2 = self.partner(x)
        shape = broadcast(cond.shape, shape2, True)
        if shape is None:
            return True
        ins = [c, x.name, other2] if self.draw(st.booleans()) else [c, other2, x.name]
        (y,) = self.node("Where", ins)
        self.add(y, x.dtype, shape)
        return True

STEPS = ("unary", "activation", "binary", "binary", "compare_where", "symbol_broadcast", "slice", "slice", "gather",
         "gather", "transpose", "reshape", "unsqueeze_squeeze", "concat", "expand", "scatternd", "scatternd", "reduce",
         "range", "shape", "matmul", "argreduce", "boxes", "slice_chain", "runtime_gather", "softmax", "flat_grid",
         "flat_grid") + MORE_STEPS + FLOW_STEPS + QUANT_STEPS


@st.composite
def cases(draw: Callable, canary: Canary, adversarial: bool | None = None, max_steps: int = 8) -> Case:
    adv = draw(st.integers(0, 3)) > 0 if adversarial is None else adversarial
    names = Names(draw, canary, adv)
    # the opsets of both torch exporters' defaults, and newer ones that onnxruntime 1.31 runs (Cast, Reshape,
    # Squeeze, Transpose, Flatten, Shape, Size, ConstantOfShape ... have new versions at 19, 21, 23, 24, 25), and
    # 11 and 12 (mmdeploy's, older YOLOv5 exports), with the attribute forms of those opsets (`Builder.node`)
    opset = draw(st.sampled_from([18, 18, 13, 17, 18, 13, 17, 20, 21, 23, 25, 11, 12]))
    b = Builder(draw, names, opset)
    symbols = [names("N"), names("M")][: draw(st.integers(1, 2))]
    dim_st = st.one_of(st.sampled_from(symbols), st.sampled_from([4, 1, 2, 3, 8, 1000, 0]))
    n_inputs = draw(st.integers(1, 3))
    for _ in range(n_inputs):
        rank = draw(st.sampled_from([2, 1, 3, 2, 1, 2, 1, 3, 2, 0]))
        shape = draw(st.lists(dim_st, min_size=rank, max_size=rank))
        if rank and not any(isinstance(d, str) for d in shape) and draw(st.booleans()):
            shape[0] = symbols[0]
        # evonnx's own check tries symbolic sizes up to 1024: keep every input below about 2**23 elements there
        if sum(isinstance(d, str) for d in shape) > 2:
            shape[-1] = 4
        if sum(isinstance(d, str) for d in shape) == 2 or _static(shape):
            shape = [d if d != 1000 else 8 for d in shape]
        dtype = draw(st.sampled_from(["float32"] * 4 + ["int64", "int32", "float16"] * 2
                                     + ["float64", "uint8", "int8"]))
        t = Tensor(names("x"), dtype, tuple(shape))
        b.inputs.append(t)
        b.pool.append(t)
        if len(symbols) == 2 and symbols[0] in shape and b.numeric(t) and draw(st.integers(0, 3)) == 0:
            # the same shape over the other symbol: broadcasting two symbolic dims against each other
            twin = Tensor(names("x"), dtype, tuple(symbols[1] if d == symbols[0] else d for d in shape))
            b.inputs.append(twin)
            b.pool.append(twin)
            op = draw(st.sampled_from(["Add", "Mul", "Max", "Sub"]))
            (out,) = b.node(op, [t.name, twin.name])
            # (built here, not by broadcast(): an adversarial symbol name may start with "?", the builder's mark
            # for sizes known only at run time)
            joint = tuple(d if d == e else f"?bcast({d},{e})" for d, e in zip(t.shape, twin.shape))
            b.add(out, dtype, joint)
    steps = []
    for _ in range(draw(st.integers(2, max_steps))):
        step = draw(st.sampled_from(STEPS))
        if not getattr(b, f"step_{step}")():
            step = "unary"
            b.step_unary()
        steps.append(step)
    # Outputs: the last tensor and up to two other unconsumed ones, so that (nearly) every node is live.
    consumed = read_names(b.nodes)
    produced = [t for t in b.pool if t not in b.inputs and all(t.name != i.name for i in b.initializers)]
    outputs = [produced[-1]] + [t for t in produced[:-1] if t.name not in consumed][-2:]
    # forms exporters write: an intermediate that later nodes read is an output too (a fused chain must still
    # write it); an input is passed through as an output
    mids = [t for t in produced if t.name in consumed and t not in outputs]
    if mids and draw(st.integers(0, 3)) == 0:
        outputs.append(draw(st.sampled_from(mids)))
    used = consumed | {o.name for o in outputs}
    inputs = [t for t in b.inputs if t.name in used] or b.inputs[:1]
    if draw(st.integers(0, 7)) == 0:
        outputs.append(draw(st.sampled_from(inputs)))
    # an initializer listed among the inputs (IR 3 style): a feed overrides it, so it is no constant
    overridable = [i for i in b.initializers if i.data_type in (DTYPES["float32"], DTYPES["float16"]) and i.dims
                   and i.name in consumed]
    if overridable and draw(st.integers(0, 5)) == 0:
        init = draw(st.sampled_from(overridable))
        inputs.append(Tensor(init.name, "float32" if init.data_type == DTYPES["float32"] else "float16",
                             tuple(init.dims)))
    symbols_used = [s for s in symbols if any(s in t.shape for t in inputs)]
    graph = helper.make_graph(
        b.nodes, names("graph"),
        [helper.make_tensor_value_info(t.name, DTYPES[t.dtype], list(t.shape)) for t in inputs],
        [helper.make_tensor_value_info(t.name, DTYPES[t.dtype], [None] * t.rank) for t in outputs],
        b.initializers)
    if adv:
        graph.doc_string = names("gdoc", allow_nul=True)
        for vi in list(graph.input) + list(graph.output):
            if draw(st.booleans()):
                vi.doc_string = names("vdoc", allow_nul=True)
    ops = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=ops, ir_version=max(8, helper.find_min_ir_version_for(ops)))
    if adv:
        model.doc_string = names("mdoc", allow_nul=True)
        model.producer_name = names("producer")
        helper.set_model_props(model, {names("key"): names("value", allow_nul=True)})
    large = draw(st.sampled_from([7, 37, 300, 4099]))
    plans = [{s: 0 for s in symbols_used}, {s: 1 for s in symbols_used}, {s: 2 for s in symbols_used},
             {s: large for s in symbols_used}]
    if len(symbols_used) == 2:
        a, c = symbols_used
        plans += [{a: 1, c: 3}, {a: 3, c: 1}, {a: 0, c: 3}, {a: 3, c: 0}]
    if not symbols_used:
        plans = [{}]
    else:  # a plan whose sizes make more than 2**16 elements is cut to keep a run short
        plans = [p for p in plans if _plan_elements(inputs, p) <= 2**21] or plans[:3]
    file_name = "model.opt.onnx"
    if adv and draw(st.integers(0, 3)) == 0:
        k = names.count = names.count + 1
        template = draw(st.sampled_from(file_name_templates()))
        names.canaries.append(canary.identifier(k))
        file_name = payload(canary, template, k).replace("/", "_").replace("\0", "_")[:150] + ".onnx"
    return Case(model=model, inputs=inputs, symbols=symbols_used, plans=plans,
                value_regime=draw(st.sampled_from(["small", "small", "wide", "extreme", "special"])),
                seed=draw(st.integers(0, 2**16)), exact=not (b.ops_used & (INEXACT_OPS | MORE_INEXACT)),
                file_name=file_name, canaries=list(names.canaries), steps=steps)
