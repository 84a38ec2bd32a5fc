"""Loading and checking input models: every failure is an `InvalidModelError` naming the file and the problem."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath

import onnx
import onnx.external_data_helper
from google.protobuf.message import DecodeError

from evonnx.errors import InvalidModelError
from evonnx.isolate import CrashError, doing, isolated

log = logging.getLogger(__name__)

OPSET_MIN = 7  # onnxruntime's oldest; a node whose definition there is older than evonnx's is left (analyze)
# The op definitions evonnx implements, reviewed up to this opset: from 22 to 26 the ops it lowers changed only
# their element types (bfloat16, float8, int4, float4, int2 added), and Cast-24's `round_mode` rounds only to
# float8e8m0, a type evonnx never fuses. A node whose definition at the model's opset is newer (Range-27, Mod-28,
# ReduceLogSum-28, Cast-28...) is left to onnxruntime (passes/analyze.py), never guessed.
REVIEWED_OPSET = 26
DOMAIN = "ai.evonnx"

# Ops whose float result has a zero sign onnxruntime does not define: Min and Max of +0 and -0 give either zero
# depending on the element's position (Eigen's SIMD packets return one operand, the scalar tail the other, and the
# broadcast forms the reverse; measured in onnxruntime 1.31 for float and double), and so do ReduceMax and ReduceMin
# of a row holding both zeros (a row of 5 or more: [-1, +0, -0, -1, -1] gives -0, [-1, -0, +0, -1, -1] gives +0, as
# the zeros meet in SIMD lanes; the kernels' own lanes differ between their x86-64-v3 and baseline variants). An exact
# output computed through one of them is compared with +0 == -0; every other exact output bit for bit, zero signs
# included (1/x, atan2 and copysign downstream tell them apart).
ZERO_SIGN_UNDEFINED = frozenset({"Min", "Max", "ReduceMax", "ReduceMin"})


@functools.cache
def opset_max() -> int:
    """The newest default-domain opset the installed onnxruntime loads, asked of it: a one-node model at each
    opset the onnx package knows, newest first (onnxruntime refuses an opset newer than its own)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    for opset in range(onnx.defs.onnx_opset_version(), OPSET_MIN, -1):
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                       ir_version=min(ir_version_for(opset), onnx.IR_VERSION))
        try:
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - onnxruntime raises several types; any refusal means "not this opset"
            continue
        return opset
    return OPSET_MIN


# Ops that only move float16 values (or select among them): onnxruntime's CPU kernels compute every other op on
# float16 in float32, and so do evonnx's (passes/lower_ops._in_float32)
HALF_MOVES = frozenset({"Concat", "Flatten", "Identity", "Reshape", "Slice", "Split", "Squeeze", "Transpose",
                        "Unsqueeze", "Expand", "Tile", "Gather", "GatherElements", "GatherND", "ScatterND",
                        "ScatterElements", "Where", "Shape", "Size"})


def half_precision_outputs(model: onnx.ModelProto) -> set[str]:
    """Graph outputs of `model` computed through float16 arithmetic (an op on float16 other than a move, or a Cast of
    a computed value to float16): onnxruntime's to within float16's rounding only, whatever their own type. It
    computes a float16 op it has no float16 kernel for in float32 between Casts, and removes its Cast to float16
    where every consumer is a Cast back (its RemoveDuplicateCastTransformer counts float16 -> float32 as lossless),
    or where it runs the consumers in float32 too, which depends on the whole graph and the optimization level:
    Exp(float16) -> Cast(float32) is never rounded to float16, at ORT_DISABLE_ALL too (fuzz case 2118)."""
    if not _names_float16(model):  # no float16 comes in or is made: no shape inference (a check calls this)
        return set()
    try:
        typed = infer_shapes(model)
    except Exception:  # noqa: BLE001 - onnx raises several types; without types, no output is marked
        return set()
    g = typed.graph
    half = {v.name for v in [*g.input, *g.output, *g.value_info] if v.type.tensor_type.elem_type == _FLOAT16}
    half |= {t.name for t in g.initializer if t.data_type == _FLOAT16}

    def rounds(n: onnx.NodeProto) -> bool:
        if n.op_type == "Cast":
            return n.output[0] in half and bool(n.input) and n.input[0] not in half and n.input[0] in produced
        return n.op_type not in HALF_MOVES and n.op_type not in ("Constant", "ConstantOfShape") \
            and any(t in half for t in [*n.input, *n.output])

    produced = {t for n in model.graph.node for t in n.output}
    return {o.name for o in model.graph.output} - outputs_untouched_by(model, rounds)


_FLOAT16 = onnx.TensorProto.FLOAT16


def _names_float16(model: onnx.ModelProto) -> bool:
    """Whether float16 enters `model` anywhere: an input, output or initializer, or an attribute (a Cast's `to`,
    a `dtype`, a Constant's tensor) that makes it. Without one, no tensor of it is float16."""
    g = model.graph
    if any(v.type.tensor_type.elem_type == _FLOAT16 for v in [*g.input, *g.output]) or any(
            t.data_type == _FLOAT16 for t in [*g.initializer, *(x.values for x in g.sparse_initializer)]):
        return True
    for n in g.node:
        for a in n.attribute:
            if (a.type == onnx.AttributeProto.INT and a.i == _FLOAT16) or (
                    a.type == onnx.AttributeProto.TENSOR and a.t.data_type == _FLOAT16) or a.type in (
                    onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                return True
    return False


def outputs_untouched_by(model: onnx.ModelProto, touches: Callable[[onnx.NodeProto], bool]) -> set[str]:
    """The graph outputs of `model` that no node for which `touches` holds computes, through any path of
    tensors (a subgraph body's outer reads included)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    out = set()
    for g_out in model.graph.output:
        stack, seen, tainted = [g_out.name], set(), False
        while stack and not tainted:
            n = producer.get(stack.pop())
            if n is None or id(n) in seen:
                continue
            seen.add(id(n))
            tainted = touches(n)
            stack.extend([*n.input, *implicit_inputs(n)])
        if not tainted:
            out.add(g_out.name)
    return out


def exact_outputs(model: onnx.ModelProto, inexact_kernels: set[str]) -> set[str]:
    """The graph outputs of an optimized `model` that must match the original bit for bit: no kernel named in
    `inexact_kernels` computes them, nor does any node onnxruntime runs that reads what a kernel of evonnx computed
    and is no move (HALF_MOVES). The bits of such a node depend on onnxruntime's own fusions around it, which the
    kernels change: in transformers' DETR (both exporters) 'scores', a kernel's exact max over a slice of the
    Softmax onnxruntime runs on the decoder's logits, came out 1 to 2 float32 steps off the original's, and the
    check refused the model ("must match exactly"). Such outputs are compared within the check's tolerance."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for t in {*filter(None, n.input), *implicit_inputs(n)}:
            consumers.setdefault(t, []).append(n)
    after: set[int] = set()
    stack = [o for n in model.graph.node if n.domain == DOMAIN for o in n.output]
    while stack:
        for n in consumers.get(stack.pop(), []):
            if id(n) not in after:
                after.add(id(n))
                stack.extend(n.output)
    return outputs_untouched_by(model, lambda n: n.name in inexact_kernels if n.domain == DOMAIN
                                else id(n) in after and n.op_type not in HALF_MOVES)


def implicit_inputs(node: onnx.NodeProto) -> list[str]:
    """The outer tensors `node`'s subgraph bodies (If, Loop, Scan; at any depth) read (the ONNX model's view of
    `passes.analyze.subgraph_reads`)."""
    out: list[str] = []
    for a in node.attribute:
        for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            inner = ({i.name for i in sub.input} | {t.name for t in sub.initializer}
                     | {o for n in sub.node for o in n.output})
            for n in sub.node:
                out += [t for t in [*filter(None, n.input), *implicit_inputs(n)] if t not in inner]
    return list(dict.fromkeys(out))


def overridable(model: onnx.ModelProto) -> list[str]:
    """Initializers that are also graph inputs of a model of IR version 4 or later: defaults a user may feed, as
    onnxruntime lets them. (Before IR 4 every initializer had to be listed as an input, and onnxruntime treats
    them as constants.) They are run-time inputs, never constants baked into a kernel."""
    if model.ir_version < 4:
        return []
    names = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name in names]


def ir_version_for(opset: int) -> int:
    """The oldest IR version that can carry `opset` of the default domain, and at least 8."""
    try:
        return max(8, onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)]))
    except (ValueError, KeyError):  # an opset newer than the onnx package knows
        return onnx.IR_VERSION


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise InvalidModelError("the model imports no version of the default ONNX domain")


def load_model(path: str | Path, *, infer: bool = True) -> onnx.ModelProto:
    """Read, check and shape-infer a model; nodes get unique names so plans and messages can refer to them.

    With `infer=False` the model is as written (no inferred value_info): what the check hands onnxruntime as the
    reference, since onnxruntime's optimizations may behave otherwise with the extra shapes.

    Tensors stored outside the model file are read only from regular files inside the model's folder (see
    `_check_external_data`). Declared dims must be >= 0. Shape inference runs without ONNX's data propagation:
    that materialises every element of each integer tensor it evaluates, so a declared dim of 2**40 or a
    `Range(0, 2**40)` would ask for terabytes; `passes/analyze.py` computes plan-time values itself, bounded.
    """
    p = Path(path)
    if not p.exists():
        raise InvalidModelError(f"{p}: no such file")
    if not p.is_file():
        raise InvalidModelError(f"{p}: not a file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, ValueError, OSError, RuntimeError) as e:
        raise InvalidModelError(f"{p}: not a readable ONNX model ({type(e).__name__}: {_first_line(e)})") from e
    if not model.graph.node and not model.graph.output:
        raise InvalidModelError(f"{p}: not a readable ONNX model (empty or truncated file)")
    external = [t for t in _tensors(model.graph) if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        for t in external:
            _check_external_data(t, p)
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(p.parent))
        except (onnx.checker.ValidationError, ValueError, OSError) as e:
            raise InvalidModelError(f"{p}: cannot read its external data: {_first_line(e)}") from e
    try:
        onnx.checker.check_model(_with_shape_fields(model))
    except (onnx.checker.ValidationError, ValueError) as e:
        raise InvalidModelError(f"{p}: fails the ONNX checker: {_first_line(e)}") from e
    opset = default_opset(model)
    if not OPSET_MIN <= opset <= opset_max():
        import onnxruntime as ort

        raise InvalidModelError(f"{p}: opset {opset} is outside the range evonnx optimizes, {OPSET_MIN} to "
                                f"{opset_max()} (the newest the installed onnxruntime {ort.__version__} runs); "
                                f"convert it with onnx.version_converter")
    for n in model.graph.node:
        if n.domain == DOMAIN:
            raise InvalidModelError(f"{p}: already optimized by evonnx (node '{n.name}' is in domain {DOMAIN}); "
                                    f"optimize the original model")
    _check_declared_dims(model, p)
    if infer:
        try:
            model = infer_shapes(model)
        except onnx.shape_inference.InferenceError as e:
            raise InvalidModelError(f"{p}: ONNX shape inference fails: {_first_line(e)}") from e
    _name_nodes(model)
    return model


def _with_shape_fields(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` for the ONNX checker: where a graph input, output or value_info has a tensor type without a shape
    (as onnx-graphsurgeon writes a tensor whose shape is None), a copy in which it has an empty one. The checker
    requires the field; onnxruntime runs such a model, and the shape stays unknown in the model evonnx plans on
    (nothing is planned on a tensor of unknown rank; the check asks for an unshaped input's shape)."""
    def unshaped(vi: onnx.ValueInfoProto) -> bool:
        return vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")

    if not any(unshaped(vi) for vi in (*model.graph.input, *model.graph.output, *model.graph.value_info)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for vi in (*copy.graph.input, *copy.graph.output, *copy.graph.value_info):
        if unshaped(vi):
            vi.type.tensor_type.shape.SetInParent()
    return copy


def infer_shapes(model: onnx.ModelProto, *, strict_mode: bool = False, data_prop: bool = False) -> onnx.ModelProto:
    """`onnx.shape_inference.infer_shapes`, run in evonnx's worker process (evonnx.isolate). ONNX's C++ inference
    aborts its process on some hostile graphs: a Slice of a dim it inferred as negative, from a Split into more
    parts than the dim holds, trips an assertion in std::clamp (fuzz case 29 of seed 2, session 28). A crash
    raises InferenceError here, as any other failure of the inference does, so that every caller's fallback
    stands."""
    try:
        data = _infer_shapes_in_worker(model.SerializeToString(), strict_mode, data_prop)
    except CrashError as e:
        raise onnx.shape_inference.InferenceError(f"ONNX shape inference crashed ({e.signal})") from None
    return onnx.load_from_string(data)


@isolated
def _infer_shapes_in_worker(data: bytes, strict_mode: bool, data_prop: bool) -> bytes:
    doing("inferring shapes (ONNX)")
    model = onnx.load_from_string(data)
    return onnx.shape_inference.infer_shapes(model, strict_mode=strict_mode, data_prop=data_prop).SerializeToString()


def _tensors(g: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a graph stores: initializers, sparse ones, and node attributes, subgraphs included."""
    yield from g.initializer
    for sparse in g.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for n in g.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield from (a.sparse_tensor.values, a.sparse_tensor.indices)
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _tensors(sub)


def _check_external_data(t: onnx.TensorProto, model_path: Path) -> None:
    """Refuse, without reading it, external data that is not a regular file inside the model's folder.

    The location must be relative, without `..`, and stay inside the folder once symbolic links are followed;
    `offset` and `length` must be integers >= 0 that lie within the file.
    """
    entries = {e.key: e.value for e in t.external_data}
    where = f"{model_path}: tensor '{t.name}' has external data"
    location = entries.get("location", "")
    parts = PurePosixPath(location.replace("\\", "/")).parts
    if not location or "\0" in location or PurePosixPath(location).is_absolute() or PureWindowsPath(location).anchor:
        raise InvalidModelError(f"{where} at {location!r}: the location must be a relative path")
    if ".." in parts:
        raise InvalidModelError(f"{where} at {location!r}: the location must not leave the model's folder")
    try:
        folder = model_path.parent.resolve()
        target = (folder / location).resolve()
        inside, regular = target.is_relative_to(folder), target.is_file()
        size = target.stat().st_size if regular else 0
    except (OSError, RuntimeError) as e:  # RuntimeError: a symbolic link loop (Python < 3.13)
        raise InvalidModelError(f"{where} at {location!r}, which cannot be resolved ({_first_line(e)})") from e
    if not inside:
        raise InvalidModelError(f"{where} at {location!r}, which leads outside the model's folder")
    if not regular:
        raise InvalidModelError(f"{where} in {location!r}, which is missing or not a regular file")
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else size - offset
    except ValueError as e:
        raise InvalidModelError(f"{where} with a malformed offset or length ({_first_line(e)})") from e
    if offset < 0 or length < 0 or offset + length > size:
        raise InvalidModelError(f"{where} at bytes {offset} to {offset + length} of {location!r}, which has "
                                f"{size} bytes")


def _check_declared_dims(model: onnx.ModelProto, p: Path) -> None:
    """Graph inputs, outputs and value_info must declare each dim as a value >= 0 or a name."""
    g = model.graph
    for kind, infos in (("input", g.input), ("output", g.output), ("tensor", g.value_info)):
        for vi in infos:
            if not vi.type.HasField("tensor_type"):
                continue
            for k, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.HasField("dim_value") and d.dim_value < 0:
                    raise InvalidModelError(f"{p}: {kind} '{vi.name}' declares dim {k} as {d.dim_value}; a dim "
                                            f"must be >= 0, or a name (dim_param) when it is dynamic")


def _name_nodes(model: onnx.ModelProto) -> None:
    seen: set[str] = set()
    for k, n in enumerate(model.graph.node):
        name = n.name or f"{n.op_type}_{k}"
        while name in seen:
            name = f"{name}_{k}"
        seen.add(name)
        n.name = name


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
