"""Symbolic shape and value analysis: every tensor's element type, symbolic shape and, when it is known at plan
time, its value (constants, and shape arithmetic such as `Shape -> Gather -> Unsqueeze -> Concat`).

Precondition: a checked model with ONNX shape inference applied. Postcondition: an `Analysis` with a
`TensorInfo` per tensor and, per node, either its standalone lowering or the `Reject` that explains why it is
left to onnxruntime. The graph is not modified.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_graphsurgeon as gs

from evonnx import expr as E
from evonnx.index import Max, Min, Poly, Sym, is_nonneg, sym
from evonnx.isolate import doing, isolated
from evonnx.model import REVIEWED_OPSET, infer_shapes, ir_version_for
from evonnx.passes import lazy as L
from evonnx.passes.lazy import Lazy, Reject
from evonnx.passes.lower_common import may_hold_zero
from evonnx.passes.lower_ops import LOWER, Derived, Known, lower_node
from evonnx.records import SizeCheck

log = logging.getLogger(__name__)

MAX_KNOWN = 4096  # elements: larger constants stay data, read by kernels as inputs
MAX_DERIVED = 64  # elements: computed tensors this small get their values extracted at plan time
# elements: a node left to onnxruntime is not evaluated at plan time when its output is known to be larger (only
# values up to MAX_KNOWN are kept; a Pad by 2**40 of a constant would make onnxruntime allocate terabytes)
MAX_FOLD = 1 << 24


@dataclass
class TensorInfo:
    name: str
    dtype: str | None  # numpy name, or None when evonnx does not handle the element type
    shape: tuple[Poly, ...] | None  # None when the rank is unknown
    known: Known | None = None
    derived: Derived | None = None  # computed from sizes alone, of any size (not a plan-time constant)
    # Size facts its shape (and so a value derived from it) relies on, from its producers back to the inputs: a
    # kernel that reads the derived value checks them, since the nodes that would have failed on them may be gone
    checks: tuple[SizeCheck, ...] = ()
    uniform: frozenset[int] = frozenset()  # axes every element along which is the same (lazy.Lazy.uniform)
    # its rank at run time may differ from the model's (downstream of a lazy.RankQuirk, or a reduction whose
    # kernel gives onnxruntime's shape of an empty input: lazy.Lazy.empty_shape): nothing after it is fused
    rank_quirk: bool = False
    quirk_shape: tuple[Poly, ...] | None = None  # its shape where the rank differs, where evonnx knows it

    @property
    def value(self) -> Known | Derived | None:
        return self.known if self.known is not None else self.derived


@dataclass
class Analysis:
    tensors: dict[str, TensorInfo]
    lowered: dict[str, list[Lazy] | Reject]  # by node name
    sym_origin: dict[str, tuple[str, int]] = field(default_factory=dict)  # symbol -> (tensor, axis)
    dim_params: set[str] = field(default_factory=set)  # symbols that are graph-input dim_params

    def info(self, t: gs.Tensor) -> TensorInfo | None:
        return self.tensors.get(t.name)


def _np_name(dtype: object) -> str | None:
    try:
        name = str(np.dtype(dtype))  # type: ignore[call-overload]
    except TypeError:
        return None
    return name if name in E.STORED else None


def known_from_array(arr: np.ndarray) -> Known | None:
    dtype = _np_name(arr.dtype)
    if dtype is None or arr.size > MAX_KNOWN:
        return None
    flat = arr.reshape(-1)
    return Known(dtype, tuple(int(d) for d in arr.shape), tuple(E.const(v, dtype) for v in flat.tolist()))


def _extract(lz: Lazy) -> Known | None:
    maybe = [d.const for d in lz.shape]
    dims = [d for d in maybe if d is not None]
    if len(dims) != len(maybe) or int(np.prod(dims)) > MAX_DERIVED:
        return None
    out = []
    for flat in range(int(np.prod(dims))):
        idx = np.unravel_index(flat, dims) if dims else ()
        e = lz.at([int(i) for i in idx])
        if isinstance(e, E.Const) or (isinstance(e, E.IndexVal) and lz.dtype == "int64") or (
                lz.dtype in E.FLOATS and E.as_integer(e) is not None):
            out.append(e)
        else:
            return None
    return Known(lz.dtype, tuple(int(d) for d in dims), tuple(out))


class _Symbols:
    """Size symbols: graph-input dim_params keep their name; unknown dims get a fresh one with its origin."""

    def __init__(self, an: Analysis):
        self.an = an

    def dim(self, d: object, tensor: str, axis: int) -> Poly:
        if isinstance(d, (int, np.integer)) and int(d) >= 0:
            return Poly.of(int(d))
        if isinstance(d, str) and d and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", d):
            self.an.sym_origin.setdefault(d, (tensor, axis))
            return sym(d)
        name = f"{re.sub(r'[^A-Za-z0-9_]', '_', tensor)}__{axis}"
        self.an.sym_origin.setdefault(name, (tensor, axis))
        return sym(name)

    def fresh(self, t: gs.Tensor) -> tuple[Poly, ...] | None:
        """`t`'s rank with a size of its own at every axis, read from the tensor at run time."""
        return None if t.shape is None else tuple(self.dim(None, t.name, k) for k in range(len(t.shape)))

    def shape(self, t: gs.Tensor) -> tuple[Poly, ...] | None:
        if t.shape is None:
            return None
        return tuple(self.dim(d, t.name, k) for k, d in enumerate(t.shape))


def _constant_node_value(node: gs.Node) -> np.ndarray | None:
    a = node.attrs
    if "value" in a:
        return np.asarray(getattr(a["value"], "values", a["value"]))
    for key, dt in (("value_float", np.float32), ("value_int", np.int64), ("value_floats", np.float32),
                    ("value_ints", np.int64)):
        if key in a:
            return np.asarray(a[key], dtype=dt)
    return None


def _run_const_node(node: gs.Node, arrays: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """Evaluate a node whose inputs are all constants with onnxruntime (its own semantics)."""
    try:
        inputs = [onnx.helper.make_tensor_value_info(f"i{k}", onnx.helper.np_dtype_to_tensor_dtype(a.dtype),
                                                     a.shape) for k, a in enumerate(arrays) if a is not None]
        names = [f"i{k}" if a is not None else "" for k, a in enumerate(arrays)]
        outs = [onnx.helper.make_empty_tensor_value_info(f"o{k}") for k in range(len(node.outputs))]
        attrs = {k: v for k, v in node.attrs.items() if not isinstance(v, (gs.Graph, gs.Tensor))}
        n = onnx.helper.make_node(node.op, names, [o.name for o in outs], domain=node.domain or "", **attrs)
        g = onnx.helper.make_graph([n], "fold", inputs, outs)
        m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                   ir_version=ir_version_for(opset))
        feed = {f"i{k}": a for k, a in enumerate(arrays) if a is not None}
        if _too_big_to_fold(m, feed):
            log.debug("not folding %s: its output would have more than %d elements", node.name, MAX_FOLD)
            return None
        return _ort_eval(m.SerializeToString(), feed)
    except Exception as e:  # noqa: BLE001 - any failure just means "not folded"; the node stays as it is
        # (a crash of onnxruntime included: the check then meets it on the original, and says so)
        log.debug("not folding %s: %s", node.name, e)
        return None


@isolated
def _ort_eval(model: bytes, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """`model`'s outputs on `feed`, run by onnxruntime in evonnx's worker process."""
    import onnxruntime as ort

    doing("folding a node of constants")
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return [np.asarray(r) for r in sess.run(None, feed)]


def _too_big_to_fold(m: onnx.ModelProto, feed: dict[str, np.ndarray]) -> bool:
    """Whether ONNX shape inference, given the constant inputs, finds an output above MAX_FOLD elements (a Pad
    by 2**40, say): onnxruntime would be asked to allocate it."""
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    probe.graph.initializer.extend(onnx.numpy_helper.from_array(a, name) for name, a in feed.items())
    inferred = infer_shapes(probe)
    for o in inferred.graph.output:
        tt = o.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            if math.prod(d.dim_value for d in tt.shape.dim) > MAX_FOLD:
                return True
    return False


def subgraph_reads(node: gs.Node) -> list[str]:
    """Names of the outer tensors that `node`'s subgraph bodies (If, Loop, Scan; at any depth) read: its implicit
    inputs. Every pass that asks who reads a tensor counts them, or a capture would break."""
    return [t.name for t in _captures(node)]


def _captures(node: gs.Node) -> list[gs.Tensor]:
    """`subgraph_reads` as graphsurgeon's tensors, each once, in the order first read."""
    out: dict[str, gs.Tensor] = {}
    for v in node.attrs.values():
        for sub in v if isinstance(v, list) else [v]:
            if isinstance(sub, gs.Graph):
                inner = {t.name for t in sub.inputs} | {t.name for n in sub.nodes for t in n.outputs}
                for n in sub.nodes:
                    for t in [x for x in n.inputs if x.name] + _captures(n):
                        if t.name not in inner:
                            out.setdefault(t.name, t)
    return list(out.values())


def computed_whole(graph: gs.Graph, an: Analysis) -> set[str]:
    """Tensors a kernel must compute at every element, even where nothing reads them: the results of integer Div
    and Mod whose divisor is not a constant free of zeros. onnxruntime fails the Run when any divisor element is
    0, read or not; a kernel checks only the elements it computes, so these results are kernel outputs."""
    out: set[str] = set()
    for n in graph.nodes:
        if n.op in RUNTIME_GATHERS and len(n.inputs) > 1 and n.outputs:
            # the same for a Gather of indices read at run time (lower_gathers): onnxruntime checks every index
            ind = an.tensors.get(n.inputs[1].name)
            if ind is None or ind.known is None or ind.known.array() is None:
                out.add(n.outputs[0].name)
            continue
        if n.op not in ("Div", "Mod") or len(n.inputs) < 2 or not n.outputs:
            continue
        res = an.tensors.get(n.outputs[0].name)
        if res is None or res.dtype not in E.INTS:
            continue
        divisor = an.tensors.get(n.inputs[1].name)
        if may_hold_zero(divisor.known if divisor is not None else None):
            out.add(n.outputs[0].name)
    return out


CANNOT_FAIL = ("Constant", "Shape", "Size", "Identity")
RUNTIME_GATHERS = ("Gather", "GatherElements", "GatherND")


def left_and_may_fail(node: gs.Node, an: Analysis) -> bool:
    """Whether onnxruntime runs `node` in the original and it may fail there, at sizes or values evonnx cannot
    rule out: a node evonnx does not lower (a ScatterND whose updates do not fit its indices at some sizes), not
    one evonnx computed at plan time. Such a node runs in the optimized model too, read or not (its values may
    be needed by nobody once a Shape of it is folded), so what it reads stays computed (fuzz case 642)."""
    if node.domain or node.op in CANNOT_FAIL or isinstance(an.lowered.get(node.name), list):
        return False
    return not all((info := an.tensors.get(t.name)) is not None and info.known is not None
                   for t in node.outputs if t.name)


def node_reads(node: gs.Node) -> list[str]:
    """The tensors `node` reads: its inputs, then its subgraphs' implicit inputs."""
    return list(dict.fromkeys([t.name for t in node.inputs if t.name] + subgraph_reads(node)))


# The largest size expression a lowered node may give its outputs, in atoms written out as a tree (Poly.weight).
# Each Slice of a symbolic size nests the size before it about three times (min/max of start, end and the dim):
# 12 chained Slices made sizes of 2.4 million atoms, and every walk over them (bounds, printing, overflow checks)
# took minutes (fuzz case 109). The detection heads of the corpus stay below 16.
MAX_SIZE_WEIGHT = 1024


def analyze(graph: gs.Graph, opset: int) -> Analysis:
    an = Analysis({}, {})
    syms = _Symbols(an)
    for t in graph.inputs:
        an.tensors[t.name] = TensorInfo(t.name, _np_name(t.dtype), syms.shape(t))
        for d in t.shape or ():
            if isinstance(d, str):
                an.dim_params.add(d)
    for t in graph.tensors().values():
        if isinstance(t, gs.Constant) and t.name not in an.tensors:
            arr = np.asarray(t.values)
            known = known_from_array(arr)
            grid = L.affine_constant(arr) if known is None and arr.dtype == np.int64 else None
            an.tensors[t.name] = TensorInfo(t.name, _np_name(arr.dtype), tuple(Poly.of(int(d)) for d in arr.shape),
                                            known, Derived(grid) if grid is not None else None)
    for node in graph.nodes:
        _analyze_node(node, an, syms, opset)
    return an


def _analyze_node(node: gs.Node, an: Analysis, syms: _Symbols, opset: int) -> None:
    outs = [o for o in node.outputs]
    if node.op == "Constant" and not node.domain:
        arr = _constant_node_value(node)
        if arr is not None:
            an.tensors[outs[0].name] = TensorInfo(outs[0].name, _np_name(arr.dtype),
                                                  tuple(Poly.of(int(d)) for d in arr.shape), known_from_array(arr))
            an.lowered[node.name] = Reject("Constant (folded into its consumers)")
            return
    if (entry := _dim_in_both_ranks(node, an)) is not None:
        an.tensors[outs[0].name] = TensorInfo(outs[0].name, "int64", (), Known("int64", (), (E.index_val(entry),)))
        an.lowered[node.name] = Reject("a dim of a tensor whose rank onnxruntime changes where it is empty, the same "
                                       "in both shapes: its value is known, onnxruntime computes it")
        return
    with L.collect_checks() as found:
        result = _lower_standalone(node, an) if (newer := _newer_definition(node, opset)) is None else newer
    too_deep = isinstance(result, list) and (w := max((d.weight() for lz in result for d in lz.shape),
                                                      default=0)) > MAX_SIZE_WEIGHT
    if too_deep:
        result = Reject(f"its output sizes nest {w} min/max/division terms deep (above {MAX_SIZE_WEIGHT}); left to "
                        "onnxruntime, its outputs get sizes of their own")
    an.lowered[node.name] = result
    if isinstance(result, list):
        load_free = all(an.tensors[t.name].value is not None for t in node.inputs if t.name)
        checks = _checks_of(node, an, found)
        for o, lz in zip(outs, result):
            known = _extract(lz)
            arr = known.array() if known is not None else None
            if arr is not None and arr.size == 0 and not load_free and node.op not in _SHAPE_OPS:
                # An empty result of a tensor computed at run time: its producer still runs in onnxruntime and may
                # fail there (onnxruntime itself folds only Shape/Size of static shapes), so it is not folded away.
                known = None
            derived = Derived(lz) if load_free and known is None and lz.dtype in E.INTS else None
            # A constant may hold only under a run-time condition (Shape of a Reshape whose -1 needs elements, an
            # empty Gather whose indices must still fit a symbolic axis): its checks stay with it, a kernel that
            # reads it checks them, and rewrite does not fold the node away.
            an.tensors[o.name] = TensorInfo(o.name, lz.dtype, lz.shape, known, derived, checks, lz.uniform,
                                            rank_quirk=lz.empty_shape is not None, quirk_shape=lz.empty_shape)
        return
    # Left to onnxruntime: shapes from ONNX shape inference, values by running it when inputs are constant.
    # a subgraph's captures count as inputs: an If of the Abs of an ArgMax with onnxruntime's empty-input shape has
    # that shape too (fuzz case 4050 of seed 33000000: [0, 0, 8] where inference says [0, 0, 1], which a kernel
    # after the If checked, and failed the Run where the original runs)
    reads = [t for t in node.inputs if t.name] + _captures(node)
    if isinstance(result, L.RankQuirk) or _empty_quirk_left(node, an) or _rank_from_disputed_dim(node, an) or (any(
            (info := an.tensors.get(t.name)) is not None and (info.rank_quirk or _inference_disagrees(t, an) == "rank")
            for t in reads) and not _fails_on_quirk(node, an)):
        for o in outs:
            an.tensors[o.name] = TensorInfo(o.name, _np_name(o.dtype) if o.dtype is not None else None, None,
                                            rank_quirk=True)
        return
    arrays = []
    for t in node.inputs:
        info = an.tensors.get(t.name) if t.name else None
        arrays.append(info.known.array() if info and info.known else None)
    # An input whose shape evonnx computes otherwise than ONNX shape inference did makes the shapes inference
    # wrote for this node's outputs unreliable: they get sizes of their own, which kernels read at run time.
    # So does a node whose sizes evonnx computed too deep to keep: inference's constants may not be onnxruntime's
    # (fuzz case 5680 of seed 33000000: a Slice of step -3 from an end of INT64_MAX keeps one element of an axis of
    # 1 in onnxruntime and none in inference, and a kernel after it checked for none).
    stale = too_deep or any(_inference_disagrees(t, an) for t in reads)
    folded = None
    if node.inputs and all(a is not None or not t.name for a, t in zip(arrays, node.inputs)) and not node.domain:
        folded = _run_const_node(node, arrays, opset)
    topk = _topk_shape(node, an)
    for k, o in enumerate(outs):
        if folded is not None and k < len(folded):
            arr = folded[k]
            an.tensors[o.name] = TensorInfo(o.name, _np_name(arr.dtype), tuple(Poly.of(int(d)) for d in arr.shape),
                                            known_from_array(arr))
        elif topk is not None:
            an.tensors[o.name] = TensorInfo(o.name, topk[1] if k == 0 else "int64", topk[0])
        else:
            an.tensors[o.name] = TensorInfo(o.name, _np_name(o.dtype) if o.dtype is not None else None,
                                            syms.shape(o) if not stale else syms.fresh(o))


def _topk_shape(node: gs.Node, an: Analysis) -> tuple[tuple[Poly, ...], str] | None:
    """The shape of a TopK's outputs (left to onnxruntime), its input's with the axis of k elements, and its values'
    type, where evonnx knows the input's shape and k: onnxruntime gives exactly that wherever the Run succeeds (it
    fails a k above the axis). ONNX shape inference leaves the dims unknown where k is computed (TorchScript's
    dynamic exports), and the Concat of the levels' top-k boxes then did not provably agree off its axis."""
    if node.op != "TopK" or node.domain not in (None, "", "ai.onnx") or len(node.outputs) != 2:
        return None
    data = an.tensors.get(node.inputs[0].name) if node.inputs else None
    if len(node.inputs) > 1:
        kt = an.tensors.get(node.inputs[1].name)
        ks = kt.known.polys() if kt is not None and kt.known is not None else None
    else:  # opset 1: an attribute
        ks = [Poly.of(int(node.attrs["k"]))] if "k" in node.attrs else None
    if data is None or data.shape is None or data.dtype is None or ks is None or len(ks) != 1 or \
            not is_nonneg(ks[0]):
        return None
    rank, axis = len(data.shape), int(node.attrs.get("axis", -1))
    if not -rank <= axis < rank:
        return None
    axis %= rank
    return data.shape[:axis] + (ks[0],) + data.shape[axis + 1:], data.dtype


def _dim_in_both_ranks(node: gs.Node, an: Analysis) -> Poly | None:
    """The value of Gather(Shape(q), i) for a constant scalar i when q takes another rank where it is empty
    (`TensorInfo.quirk_shape`) and dim i is the same in both shapes, else None. TorchScript's dynamic-batch exports
    of mmdet's pre-NMS top-k take k = scores.shape[1] on a level with fewer anchors than nms_pre: ReduceMax(x[B, A,
    80], [-1]) is [B, A], or [0, A, 80] at B = 0, and dim 1 is A in both, so the TopK's k is known and the TopK
    provably fails on the other shape (`_fails_on_quirk`); without this nothing after it fused (838 nodes -> 228)."""
    if node.op != "Gather" or node.domain not in (None, "", "ai.onnx") or len(node.inputs) != 2 or \
            int(node.attrs.get("axis", 0)) != 0 or len(node.inputs[0].inputs) != 1:
        return None
    shape_node = node.inputs[0].inputs[0]
    if shape_node.op != "Shape" or shape_node.domain not in (None, "", "ai.onnx") or shape_node.attrs.get(
            "start", 0) != 0 or shape_node.attrs.get("end") is not None or not shape_node.inputs:
        return None
    q = an.tensors.get(shape_node.inputs[0].name)
    ind = an.tensors.get(node.inputs[1].name)
    arr = ind.known.array() if ind is not None and ind.known is not None else None
    if q is None or q.shape is None or q.quirk_shape is None or arr is None or arr.shape != ():
        return None
    i = int(arr)
    a, b = i + len(q.shape) if i < 0 else i, i + len(q.quirk_shape) if i < 0 else i
    if not (0 <= a < len(q.shape) and 0 <= b < len(q.quirk_shape)) or q.shape[a] != q.quirk_shape[b]:
        return None
    return q.shape[a]


def _fails_on_quirk(node: gs.Node, an: Analysis) -> bool:
    """Whether onnxruntime fails `node` wherever its input takes its other rank, so that the quirk ends here: a
    TopK of constant k along an axis that, in the quirk's shape, is a constant below k. mmdet's pre-NMS top-k,
    `scores.max(-1)` then `.topk(1000)`: ReduceMax(x[B, A, 80], [-1]) is x itself at B = 0 (onnxruntime's
    empty-input quirk), and a TopK of 1000 along its last axis of 80 fails there. Without this, nothing after
    the TopK fused in the dynamic-batch exports (RetinaNet's, dynamo at opset 18: 167 nodes -> 140)."""
    if node.op != "TopK" or node.domain not in (None, "", "ai.onnx") or len(node.inputs) < 2 or any(
            (i := an.tensors.get(t.name)) is not None and (i.rank_quirk or _inference_disagrees(t, an) == "rank")
            for t in node.inputs[1:] if t.name):
        return False
    data, k = an.tensors.get(node.inputs[0].name), an.tensors.get(node.inputs[1].name)
    if data is None or data.quirk_shape is None or _inference_disagrees(node.inputs[0], an) == "rank":
        return False
    arr = k.known.array() if k is not None and k.known is not None else None
    axis = int(node.attrs.get("axis", -1))
    rank = len(data.quirk_shape)
    if arr is None or arr.size != 1 or not -rank <= axis < rank:
        return False
    along = data.quirk_shape[axis].const
    return along is not None and int(arr.reshape(-1)[0]) > along


def _inference_disagrees(t: gs.Tensor, an: Analysis) -> str | None:
    """Where evonnx's shape of `t` provably differs from the one ONNX shape inference wrote into the model:
    "rank", "dims" or None. evonnx follows onnxruntime's kernels, and inference does not always: a Slice with
    step INT64_MIN from an end of INT64_MAX keeps one element in onnxruntime and none in inference."""
    info = an.tensors.get(t.name)
    if info is None or info.shape is None or t.shape is None:
        return None
    if len(t.shape) != len(info.shape):
        return "rank"
    return "dims" if any(_dim_disagrees(d, p, an) for d, p in zip(t.shape, info.shape)) else None


def _dim_disagrees(d: object, p: Poly, an: Analysis) -> bool:
    """Whether evonnx's size `p` provably differs from inference's `d` (an int, a dim_param name or None)."""
    if isinstance(d, (int, np.integer)) and int(d) >= 0:
        if p.const is not None and p.const != int(d):
            return True
        # a size that depends on others where inference says a constant: onnxruntime's shape of an empty
        # reduction, `1 + (1 - min(2*M, 1))` for ReduceMin(x[2, M], [-2], keepdims=1), which is 2 at M = 0
        # where inference says 1 (fuzz case 3509: a kernel after a ScatterND left to onnxruntime took the
        # 1 for granted, and its size check failed the Run where the original runs)
        return p.const is None and any(isinstance(a, (Min, Max)) for a in p.atoms())
    return isinstance(d, str) and d in an.dim_params and p != sym(d) and all(
        isinstance(a, Sym) and a.name in an.dim_params for a in p.atoms())


# Ops whose output rank is a size of one of their inputs: (input slot, axis). GatherND's is its index tuples'
# length, the others' their shape or axes vector's.
_RANK_FROM_DIM = {"GatherND": (1, -1), "Reshape": (1, 0), "Expand": (1, 0), "Unsqueeze": (1, 0),
                  "Squeeze": (1, 0), "ConstantOfShape": (0, 0)}


def _rank_from_disputed_dim(node: gs.Node, an: Analysis) -> bool:
    """Whether `node`, left to onnxruntime, takes its output rank from an input size that inference got otherwise
    than evonnx: inference's rank of the output is then unreliable. ArgMin(x[8, N, N], axis=-1, keepdims=1) is
    [8, N, 0] at N = 0 in onnxruntime (lower_reduce._empty_quirk), so a GatherND of it as indices has index tuples
    of 0 elements there and returns rank 5 where inference says 4 (fuzz case 1819: a kernel after it failed the
    Run where the original runs)."""
    at = _RANK_FROM_DIM.get(node.op) if node.domain in (None, "", "ai.onnx") else None
    if at is None or len(node.inputs) <= at[0] or not node.inputs[at[0]].name:
        return False
    t = node.inputs[at[0]]
    info = an.tensors.get(t.name)
    if info is None or info.shape is None or t.shape is None or len(t.shape) != len(info.shape) or \
            not -len(info.shape) <= at[1] < len(info.shape):
        return False
    return _dim_disagrees(t.shape[at[1]], info.shape[at[1]], an)


_SHAPE_OPS = ("Shape", "Size")
_QUIRK_OPS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin")


def _empty_quirk_left(node: gs.Node, an: Analysis) -> bool:
    """A reduction left to onnxruntime whose result can have another shape than the model says: an axis written
    negatively, of an input that can be empty (lower_reduce._empty_quirk). An integer ReduceSum(x[N, M], [-2, -1])
    gives [N, M] at N = 0, not [1, 1], and a kernel after it must not take the [1, 1] for granted."""
    if node.op not in _QUIRK_OPS or node.domain not in (None, "", "ai.onnx") or not node.inputs:
        return False
    info = an.tensors.get(node.inputs[0].name)
    if info is None or info.shape is None or all((d.const or 0) > 0 for d in info.shape):
        return False
    if node.op in ("ArgMax", "ArgMin"):
        return int(node.attrs.get("axis", 0)) < 0
    axes = node.attrs.get("axes")
    if len(node.inputs) > 1 and node.inputs[1].name:
        known = an.tensors.get(node.inputs[1].name)
        arr = known.known.array() if known is not None and known.known is not None else None
        if arr is None:
            return True  # axes computed at run time: any of them may be negative
        axes = arr.ravel().tolist()
    return any(int(a) < 0 for a in axes or [])


def _checks_of(node: gs.Node, an: Analysis, found: list[SizeCheck]) -> tuple[SizeCheck, ...]:
    out: dict[tuple[object, ...], SizeCheck] = {}
    for t in node.inputs:
        info = an.tensors.get(t.name) if t.name else None
        for c in info.checks if info is not None else ():
            out.setdefault((c.kind, c.lhs, c.rhs, c.unless), c)
    for c in found:
        out.setdefault((c.kind, c.lhs, c.rhs, c.unless), replace(c, why=f"{c.why} in node '{node.name}'"))
    return tuple(out.values())


@functools.cache
def _since_version(op: str, opset: int) -> int | None:
    try:
        return int(onnx.defs.get_schema(op, opset, "").since_version)
    except onnx.defs.SchemaError:
        return None


# The oldest definition of an op whose semantics evonnx's lowering implements, where that is not the op's
# definition at opset 11 (every other op's older definitions, up to opset 13, differ from 11's in element types
# only, or take as attributes what the lowering reads either way: Squeeze, Unsqueeze and Split's axes and sizes,
# ReduceSum's axes). Softmax, LogSoftmax before 13 flatten the input into 2-D at the axis and normalise over all
# the dims after it together. Squeeze-1, Unsqueeze-1 and Split-2 are -11 without negative axes.
OLDEST_DEFINITION = {"Softmax": 13, "LogSoftmax": 13, "Squeeze": 1, "Unsqueeze": 1, "Split": 2}


def _newer_definition(node: gs.Node, opset: int) -> Reject | None:
    """A Reject for a node whose definition at the model's opset is newer than those evonnx implements, or older
    (`OLDEST_DEFINITION`; before opset 11, Slice-1's attributes, Clip-6's and the like)."""
    if node.domain not in (None, "", "ai.onnx") or node.op not in LOWER:
        return None
    since = _since_version(node.op, opset)
    if since is not None and since > REVIEWED_OPSET:
        return Reject(f"{node.op}-{since} (the definition at opset {opset}) is newer than those evonnx implements "
                      f"(up to opset {REVIEWED_OPSET})")
    oldest = OLDEST_DEFINITION.get(node.op, _since_version(node.op, 11))
    if since is not None and oldest is not None and since < oldest:
        return Reject(f"{node.op}-{since} (the definition at opset {opset}) is older than those evonnx implements "
                      f"({node.op}-{oldest} and later)")
    return None


def _lower_standalone(node: gs.Node, an: Analysis) -> list[Lazy] | Reject:
    if node.domain not in (None, "", "ai.onnx"):
        return Reject(f"custom domain '{node.domain}'")
    if node.op not in LOWER:
        return Reject(f"{node.op} is not handled by evonnx")
    args: list[Lazy | None] = []
    vals: list[Known | Derived | None] = []
    for k, t in enumerate(node.inputs):
        if not t.name:
            args.append(None)
            vals.append(None)
            continue
        info = an.tensors.get(t.name)
        if info is None or info.shape is None or info.dtype is None:
            return Reject(f"input {k} ('{t.name}') has an unknown or unsupported type or rank")
        if info.rank_quirk:
            # a kernel output whose rank onnxruntime changes where it is empty (lazy.Lazy.empty_shape)
            return L.RankQuirk(f"input {k} ('{t.name}') has another rank where it is empty, in onnxruntime")
        vals.append(info.value)
        args.append(info.value.lazy() if info.value is not None else L.source(k, info.dtype, info.shape, info.uniform))
    try:
        return lower_node(node.op, dict(node.attrs), args, vals, len(node.outputs))
    except Reject as r:
        return r
