"""Nodes onnxruntime already runs better than a fused kernel would: planning on top of its own graph optimizations.

onnxruntime's CPU EP (ORT_ENABLE_ALL) rewrites the convolution trunk of a detector before it runs it
(../shared/notes/ort-fusions.md, measured on YOLOv8n, YOLO11n, YOLOv10n and YOLOv8n-seg with onnxruntime 1.31):
- an activation that reads a Conv output is folded into the convolution (FusedConv / NchwcConv with an activation)
  or, for SiLU `x * Sigmoid(x)`, becomes one vectorised QuickGelu;
- convolutions, pooling, Resize, and the Add / Concat / activations between them run in a blocked (NCHWc) layout,
  so a chain Conv -> activation -> Conv needs no layout change. A Fused node in that chain costs a ReorderOutput
  before it and a ReorderInput after it (about 0.1 ms each at 640x640), on top of losing the fused activation:
  fusing the SiLUs of YOLOv8n made the whole model 12-14 % slower;
- a Transpose or a scalar-constant Mul whose only consumer is a MatMul is folded into a FusedMatMul;
- a node whose inputs are all constants (initializers, Constant nodes, Shape/Size of a tensor of static shape, and
  what is computed from those alone) is constant-folded once, at session start (`folded`). A kernel there runs on
  every call instead, and hides the values from onnxruntime's later folding: in torchvision's RetinaNet, a kernel
  computing the Resize sizes from ReduceMin/ReduceMax of a constant left the padding arithmetic after the Resize
  unfolded, and onnxruntime's convolutions then differed by 3 ulp from the original's.

So the planner leaves those nodes to onnxruntime (`layout_chain`), and fuses around them: the reshapes,
transposes, decode arithmetic and post-processing that onnxruntime runs node by node. The rules are static (what
onnxruntime's transformers match), so a plan never crosses a blocked-layout chain in the first place; the
measured never-slower guard (`api.optimize`) remains the net for what they miss.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from evonnx.isolate import doing, isolated
from evonnx.model import _name_nodes, _with_shape_fields, infer_shapes
from evonnx.passes.analyze import Analysis, _constant_node_value
from evonnx.passes.lower_ops import REDUCTIONS

CONVS = frozenset({"Conv", "ConvTranspose"})
# consumers that read the blocked layout directly
BLOCKED_READERS = frozenset({"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Resize",
                             "Upsample", "BatchNormalization"})
# activations onnxruntime folds into the convolution that produces their input (FusedConv, MLAS's activation
# kinds), and Gelu, which it runs in the blocked layout. Measured on 1.31 (Conv -> op -> Conv, ORT_ENABLE_ALL): Elu,
# Selu, Softplus, ThresholdedRelu, Softsign and Celu are neither folded nor blocked; onnxruntime reorders to NCHW
# before them, so a kernel there costs no reorder of its own. Its Softplus is scalar: 12.4 ms on 819 K floats, twice
# the 3x3 convolution before it (a Mish, Softplus -> Tanh -> Mul, in YOLOv4-style trunks)
ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "Gelu"})
# ops that keep a blocked tensor blocked when every data input is blocked
CHAIN = frozenset({"Add", "Sum", "Mul", "Concat", "Max", "Min"}) | ACTIVATIONS
MATMULS = frozenset({"MatMul", "FusedMatMul", "Gemm"})
# never folded: a new value on every run
NONDETERMINISTIC = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial",
                              "Bernoulli"})
# never folded by onnxruntime although their inputs are constant: its constant folding skips DequantizeLinear, so
# that its QDQ fusions find the DequantizeLinear of each quantized weight and bias and run the Conv, MatMul, Add ...
# in int8 (QLinearConv). A DequantizeLinear folded into a float initializer by evonnx left the Conv in float: a
# quantized YOLOv8n (onnxruntime.quantization, QDQ) then gave other results than the original, and ran slower
NOT_FOLDED = NONDETERMINISTIC | {"DequantizeLinear"}


def _const_value(t: gs.Tensor) -> np.ndarray | None:
    """The value of a constant tensor (an initializer or a Constant node's `value`), else None."""
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    if t.inputs and t.inputs[0].op == "Constant":
        v = _constant_node_value(t.inputs[0])
        return v if v is not None else np.zeros(0)  # a sparse or string value: constant all the same
    return None


def _is_const(t: gs.Tensor) -> bool:
    return _const_value(t) is not None


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


def _hardswish_mul(n: gs.Node) -> bool:
    """Mul(x, HardSigmoid(x)) in either order, HardSigmoid's alpha 1/6 and beta 0.5: a HardSwish, as opset 13
    exports of torch's hardswish spell it."""
    if n.op != "Mul" or len(n.inputs) != 2:
        return False
    a, b = n.inputs
    for x, h in ((a, b), (b, a)):
        p = h.inputs[0] if h.inputs else None
        if p is not None and p.op == "HardSigmoid" and p.inputs and p.inputs[0] is x and \
                abs(float(p.attrs.get("alpha", 0.2)) - 1 / 6) < 1e-6 and \
                abs(float(p.attrs.get("beta", 0.5)) - 0.5) < 1e-6:
            return True
    return False


def _gelu_nodes(graph: gs.Graph) -> list[str]:
    """The nodes of each Gelu written with Erf: Div(x, c) or Mul(x, c) -> Erf -> Add(1) -> Mul(x) and Mul(0.5) in
    either order, and a bias Add that computes x."""
    out: list[str] = []
    for e in graph.nodes:
        if e.op != "Erf" or not e.inputs or not e.inputs[0].inputs or len(e.outputs[0].outputs) != 1:
            continue
        d = e.inputs[0].inputs[0]
        a = e.outputs[0].outputs[0]
        if d.op not in ("Div", "Mul") or len(d.inputs) != 2 or not _is_const(d.inputs[1]) or a.op != "Add":
            continue
        x = d.inputs[0]
        chain, t = [d, e, a], a.outputs[0]
        for _ in range(2):
            if len(t.outputs) != 1 or t.outputs[0].op != "Mul":
                break
            chain.append(t.outputs[0])
            t = t.outputs[0].outputs[0]
        if len(chain) < 5 or not any(i is x for m in chain[3:] for i in m.inputs):
            continue
        bias = x.inputs[0] if x.inputs else None
        if bias is not None and bias.op == "Add" and any(_is_const(i) for i in bias.inputs):
            chain.append(bias)
        out += [n.name for n in chain]
    return out


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
            activation[n.name] = (f"a {n.op} of a convolution's output, which onnxruntime "
                                  f"folds into the convolution (or into QuickGelu) in its blocked layout")
            blocked.update(outs)
        elif _silu_mul(n) and all(t.name in blocked for t in data):
            activation[n.name] = ("the Mul of a SiLU on a convolution's output, which "
                                  "onnxruntime runs as one vectorised QuickGelu in its blocked layout")
            blocked.update(outs)
        elif _hardswish_mul(n) and all(t.name in blocked for t in data):
            # onnxruntime folds Conv -> HardSigmoid -> Mul into one convolution with a HardSwish activation: a
            # kernel taking the Mul left the HardSigmoid alone and added a reorder (YOLOv6-lite's backbone)
            activation[n.name] = ("the Mul of a HardSwish on a convolution's output, which onnxruntime folds into "
                                  "the convolution (activation HardSwish)")
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
            leave[n.name] = (f"a {n.op} between convolutions, which onnxruntime runs in its "
                             f"blocked layout (a kernel there costs a layout reorder on each side)")
    # The erf form of Gelu, x * 0.5 * (1 + erf(x / sqrt 2)), with the bias Add before it: onnxruntime fuses the
    # chain into one Gelu (BiasGelu)
    for name in _gelu_nodes(graph):
        leave.setdefault(name, "a node of a Gelu (erf form), which onnxruntime fuses into one Gelu")
    # Transposes first: a scalar Mul feeding a MatMul through a Transpose is folded as well (onnxruntime's
    # transpose optimizer moves the Transpose ahead of the Mul; the ONNX FlexAttention function's K * scale). A
    # Div by a scalar constant is folded alike (its MatMulScaleFusion; fuzz case 416: x / 65504 then MatMul gave
    # x * (1 / 65504) * w there, a rounding away from a kernel's division). Consumers whose results nothing reads
    # do not count: onnxruntime drops them first.
    folded_into_matmul: set[str] = set()
    outputs = {o.name for o in graph.outputs}

    def read(c: gs.Node) -> bool:
        return any(t.outputs or t.name in outputs for t in c.outputs)

    for op in ("Transpose", "Mul", "Div"):
        for n in graph.nodes:
            if n.op != op or (op == "Mul" and not (any(_is_const(t) for t in n.inputs) and _scalar_const(n))):
                continue
            if op == "Div" and not (len(n.inputs) == 2 and _is_const(n.inputs[1])
                                    and (v := _const_value(n.inputs[1])) is not None and v.size == 1):
                continue
            consumers = [c for t in n.outputs for c in t.outputs if read(c)]
            if consumers and all(c.op in MATMULS or c.name in folded_into_matmul for c in consumers) and not any(
                    t.name in outputs for t in n.outputs):
                folded_into_matmul.add(n.name)
                leave.setdefault(n.name, f"a {n.op} that onnxruntime folds into the MatMul "
                                         f"it feeds (FusedMatMul)")
    return leave


def _scalar_const(n: gs.Node) -> bool:
    return any((v := _const_value(t)) is not None and v.size == 1 for t in n.inputs)


def folded(graph: gs.Graph, an: Analysis) -> dict[str, str]:
    """Node name -> why onnxruntime keeps it: nodes whose every input is constant to onnxruntime's constant folding
    (see the module doc) and whose values reach a node that stays with onnxruntime (rejected in `an.lowered`) or a
    graph output. Constants read only by nodes evonnx fuses may be fused with them: a kernel computes a grid inline
    from its indices cheaper than it reads a folded one. Nodes evonnx itself knows at plan time are not named (the
    rewrite turns them into initializers). `graph` is toposorted."""
    const: set[str] = set()
    region: list[gs.Node] = []
    for n in graph.nodes:
        inputs = [t for t in n.inputs if t.name]
        if n.op == "Constant":
            const.update(t.name for t in n.outputs)
            continue
        if n.op in ("Shape", "Size") and inputs:
            info = an.tensors.get(inputs[0].name)
            static = info is not None and info.shape is not None and all(d.const is not None for d in info.shape)
            if static or _is_const(inputs[0]) or inputs[0].name in const:
                const.update(t.name for t in n.outputs)
            continue
        if n.op in NOT_FOLDED or n.domain not in (None, "", "ai.onnx") or any(
                isinstance(v, gs.Graph) for v in n.attrs.values()):
            continue
        if inputs and all(_is_const(t) or t.name in const for t in inputs):
            const.update(t.name for t in n.outputs)
            region.append(n)
    members = {n.name for n in region}
    outputs = {t.name for t in graph.outputs}
    leave: dict[str, str] = {}
    for n in reversed(region):
        consumers = [c for t in n.outputs for c in t.outputs]
        to_ort = any(t.name in outputs for t in n.outputs) or any(
            c.name in leave or (c.name not in members and not isinstance(an.lowered.get(c.name), list))
            for c in consumers)
        unknown = any(t.name and (info := an.tensors.get(t.name)) is not None and info.known is None
                      for t in n.outputs)
        if to_ort and unknown:
            leave[n.name] = (f"a {n.op} of constants only, which onnxruntime folds once at "
                             f"session start (its value reaches a node onnxruntime runs)")
    return leave


# the name onnxruntime gives the Casts it puts around float16 ops that its CPU EP runs in float
_CAST_PREFIX = "InsertedPrecisionFreeCast_"


def _has_bodies(model: onnx.ModelProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for n in model.graph.node for a in n.attribute)


def fold_like_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """`model` after onnxruntime's basic graph optimizations (ORT_ENABLE_BASIC but its transpose optimizer: constant
    folding, Shape of static shapes, redundant Identity/Slice/Unsqueeze/Dropout elimination, Conv+BatchNormalization/
    Add/Mul), which it
    applies to every model it loads on any execution provider, so evonnx plans on the graph onnxruntime will run:
    what onnxruntime folds once at session start never becomes a kernel that runs on every call. `model` is the
    model as written (`load_model(infer=False)`): onnxruntime rewrites more where ONNX's inferred value_info
    names equal symbolic dims, rewrites the original as the user loads it never gets. The result
    holds only standard ONNX ops (anything else: None), keeps `model`'s opset imports and IR version, and is shape-
    inferred and named as `load_model` does. None where onnxruntime cannot load the model or write it back; the
    caller then plans on `model` itself. Nothing is left in the temp folder."""
    try:
        data = model.SerializeToString()
    except ValueError:  # over 2 GB: onnxruntime would need external data
        return None
    written = _ort_basic(data)  # a crash of onnxruntime here (CrashError) is the model's: it is reported
    if written is None:
        return None
    folded = onnx.load_model_from_string(written)
    try:  # onnxruntime writes back models it cannot load: its float16 Casts inserted into If/Loop bodies take
        # names that the main graph defines too (fuzz: an If capturing a float16 tensor), against SSA
        onnx.checker.check_model(_with_shape_fields(folded))
    except (onnx.checker.ValidationError, ValueError):
        return None
    if _has_bodies(folded) and any(n.name.startswith(_CAST_PREFIX) for n in folded.graph.node):
        # nor is its float16 cast insertion idempotent around bodies: a body reading a float16 tensor of the
        # main graph gets a Cast named after it on the next load too, which the rewrite's own Cast of that name
        # already defines (fuzz case 4098 of seed 10000094: a Loop adding a captured float16 tensor)
        return None
    if any(n.domain not in ("", "ai.onnx") for n in folded.graph.node) and not any(
            n.domain not in ("", "ai.onnx") for n in model.graph.node):
        return None
    if [i.name for i in folded.graph.input] != [i.name for i in model.graph.input] or \
            [o.name for o in folded.graph.output] != [o.name for o in model.graph.output]:
        return None  # the interface must stay the model's (overridable initializers included)
    del folded.opset_import[:]
    folded.opset_import.extend(model.opset_import)
    folded.ir_version = model.ir_version
    try:
        folded = infer_shapes(folded)
    except onnx.shape_inference.InferenceError:
        return None
    _name_nodes(folded)
    _positive_axes_where_rewritten(folded, data)
    return folded


# reductions whose axes onnxruntime looks up as written on an empty input (lower_reduce._empty_quirk)
_AXES_OPS = REDUCTIONS - {"Softmax", "LogSoftmax"}


def _written_axes(n: onnx.NodeProto, consts: dict[str, np.ndarray]) -> list[int] | None:
    """The axes of reduction `n` as written (attribute or constant input), or None."""
    for a in n.attribute:
        if a.name in ("axes", "axis"):
            return [int(v) for v in (a.ints if a.name == "axes" else [a.i])]
    if len(n.input) > 1 and n.input[1] in consts and consts[n.input[1]].dtype.kind in "iu":
        return [int(v) for v in consts[n.input[1]].reshape(-1)]
    return None


def _positive_axes_where_rewritten(model: onnx.ModelProto, as_written: bytes) -> None:
    """Writes the axes of a reduction positive where onnxruntime's transpose optimizer rewrites it.

    onnxruntime keeps an axis written negatively at its input size when the input is empty (`_empty_quirk`), and
    evonnx reproduces that. But onnxruntime's transpose optimizer (part of every session, unlike in
    `fold_like_onnxruntime`) pushes a Transpose through a reduction and writes the new node's axes positive, and
    the quirk is gone: Transpose -> ReduceMean(axes=[-4, -3, -1]) of an empty input gave [1, 1, 0, 1], and evonnx's
    [1, 3, 0, 0] failed the check (fuzz seed 180001). So the model is loaded once more with that optimizer, and a
    reduction with a negative axis whose output no longer comes from a node of its kind with the same axes is
    written with its axes positive, as onnxruntime will run it. That second load is of the model as written
    (`as_written`), as the user's session loads it, not of `model`: on a float16 model onnxruntime's first load
    has put Casts to float around the reduction, and the transpose optimizer then leaves it alone, where on the
    model as written it pushes the Transpose through it (fuzz case 3396: ReduceMean(Transpose(x[2, 0]), [-2, -1])
    gives [1, 1])."""
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = onnx.numpy_helper.to_array(n.attribute[0].t)
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in [*model.graph.input, *model.graph.value_info]
             if vi.type.tensor_type.HasField("shape")}
    negative = [n for n in model.graph.node if n.op_type in _AXES_OPS and n.domain in ("", "ai.onnx")
                and any(a < 0 for a in _written_axes(n, consts) or []) and n.input and n.input[0] in ranks]
    if not negative:
        return
    written = _ort_basic(as_written, transposes=True)
    if written is None:
        return
    seen = onnx.load_model_from_string(written)
    seen_consts = {t.name: onnx.numpy_helper.to_array(t) for t in seen.graph.initializer}
    kept = {(n.op_type, n.output[0], tuple(_written_axes(n, seen_consts) or ())) for n in seen.graph.node
            if n.output and n.op_type in _AXES_OPS}  # (another op's input 1 is no axes: Max(x, inf), fuzz seed 200005)
    # A twin on the same input with the same axes, which onnxruntime's common-subexpression elimination keeps in
    # place of this one, is no rewrite: the quirk stays (fuzz case 147, seed 200003: two ReduceMean(x, [-1]))
    twins = {(n.op_type, n.input[0], tuple(_written_axes(n, seen_consts) or ())) for n in seen.graph.node
             if n.input and n.op_type in _AXES_OPS}
    for n in negative:
        axes = _written_axes(n, consts) or []
        if (n.op_type, n.output[0], tuple(axes)) in kept or (n.op_type, n.input[0], tuple(axes)) in twins:
            continue
        rank = ranks[n.input[0]]
        positive = [a + rank if a < 0 else a for a in axes]
        attr = next((a for a in n.attribute if a.name in ("axes", "axis")), None)
        if attr is not None and attr.name == "axes":
            del attr.ints[:]
            attr.ints.extend(positive)
        elif attr is not None:
            attr.i = positive[0]
        else:
            taken = {t for m in model.graph.node for t in [*m.input, *m.output]} | set(consts)
            name = next(f"{n.output[0]}__positive_axes{k or ''}" for k in range(len(taken) + 1)
                        if f"{n.output[0]}__positive_axes{k or ''}" not in taken)
            model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(positive, np.int64), name))
            n.input[1] = name


@isolated
def _ort_basic(model: bytes, transposes: bool = False) -> bytes | None:
    """`model` as onnxruntime writes it back after its basic optimizations (with `transposes`, its transpose
    optimizer too), run in evonnx's worker process; None when onnxruntime refuses it. Its temporary folder is
    removed."""
    import tempfile

    import onnxruntime as ort

    doing("loading the model (onnxruntime's constant folding)")
    with tempfile.TemporaryDirectory(prefix="evonnx-fold-") as tmp:
        out = Path(tmp) / "folded.onnx"
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(out)
        so.log_severity_level = 4
        try:
            # not its transpose optimizer: moving Transposes through elementwise ops is what a kernel does anyway,
            # and the rewritten nodes lose their names (reports, `leave`)
            ort.InferenceSession(model, so, providers=["CPUExecutionProvider"],
                                 disabled_optimizers=[] if transposes else ["TransposeOptimizer"])
            return out.read_bytes()
        except Exception:  # noqa: BLE001 - onnxruntime raises several unrelated types; plan on the model as is
            return None
