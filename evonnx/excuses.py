"""Excuses of the check that run the original again: a TopK that orders near-equal values otherwise, or a
comparison against a threshold that decides a near tie otherwise (`near_ties`), and outputs computed from a
Concat that onnxruntime fills from memory it never wrote (`from_empty_concat`). Both take onnxruntime's runs as a
function (`Runner`), so that the check owns them.

A last-bit difference upstream of a TopK can reorder values a rounding error apart: in RT-DETR two sigmoid scores
8 ulp apart swap rows among its 300 queries, and the boxes gathered by them swap too, which onnxruntime itself
does with another thread count. A score a last bit apart from onnxruntime's, compared against a threshold, keeps
or drops one candidate box (torchvision's FCOS and RetinaNet: NonZero(Greater(score, 0.05))). No tolerance on the
outputs covers that, so the check asks instead whether the outputs are the original's once every TopK and every
such comparison takes the optimized model's choices, and whether those choices differ from onnxruntime's only
between values within the float tolerance of each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from evonnx.model import infer_shapes
from evonnx.passes.lower_groups import THRESHOLDS

# onnxruntime's memory planner failing a run: a buffer planned for a tensor's inferred shape, re-used where an
# empty-input quirk (ReduceMax(x[N], [-1]) is [0] at N = 0, inferred [1]) gives another shape
REUSE_ERROR = "Shape mismatch attempting to re-use buffer"

# onnxruntime's outputs of a model by name, or None where it cannot run it: (model, feeds, what it is for)
Runner = Callable[[onnx.ModelProto, Mapping[str, np.ndarray], str], "dict[str, np.ndarray] | None"]


def near_ties(original: onnx.ModelProto, feeds: Mapping[str, np.ndarray], chosen: Mapping[str, np.ndarray],
              run: Runner, matches: Callable[[Mapping[str, np.ndarray]], bool], rtol: Mapping[str, float]) -> bool:
    """Whether the optimized model's outputs are explained by its near-tie choices: `chosen` maps, by name, each
    TopK index output of the original and each output of a comparison against a threshold (`THRESHOLDS`) that the
    optimized model computes, to its values in the optimized model on `feeds`. Where they differ from
    onnxruntime's, onnxruntime's own operands must be within `rtol` (by their dtype) of each other: the two
    elements a TopK ranked, or a comparison's two sides. Then the original is run with those outputs fed in (a
    TopK's values are onnxruntime's input at the chosen indices), and `matches` judges its outputs against the
    optimized model's."""
    picks = [n for n in original.graph.node if n.domain in ("", "ai.onnx")
             and ((n.op_type == "TopK" and len(n.output) > 1 and n.output[1] in chosen)
                  or (n.op_type in (*THRESHOLDS, "NonMaxSuppression") and n.output[0] in chosen))]
    if not picks:
        return False
    fed: dict[str, np.ndarray] = {}
    inits = {t.name: t for t in original.graph.initializer}
    for n in picks:  # in graph order: each node's inputs as they are once the nodes before it took evonnx's choices
        out = n.output[1] if n.op_type == "TopK" else n.output[0]
        operands = list(n.input[:1] if n.op_type == "TopK" else n.input[:2] if n.op_type in THRESHOLDS else n.input)
        asked = [t for t in operands if t and t not in inits]
        values = run(_fed(original, fed, [*asked, out]), {**feeds, **fed}, f"for the inputs of its {n.op_type}")
        if values is None:
            return False
        values = {**{t: numpy_helper.to_array(inits[t]) for t in operands if t in inits}, **values}
        mine, theirs = np.asarray(chosen[out]), values[out]
        if n.op_type == "NonMaxSuppression":
            if not nms_near_ties(n, [values[t] if t else None for t in operands], mine, theirs,
                                 rtol.get("float32", 1e-4)):
                return False
            fed[out] = mine
            continue
        if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
            return False
        if n.op_type == "TopK":
            x = values[n.input[0]]
            axis = _axis(n, x.ndim)
            if x.dtype.kind != "f" or (mine < 0).any() or (mine >= x.shape[axis]).any():
                return False
            tol = rtol.get(str(x.dtype), 1e-3)
            a = np.take_along_axis(x, mine, axis).astype(np.float64)
            b = np.take_along_axis(x, theirs, axis).astype(np.float64)
            fed[n.output[0]] = np.take_along_axis(x, mine, axis)
        else:
            x, y = (np.asarray(values[t]) for t in operands)
            if x.dtype.kind != "f" or y.dtype != x.dtype:
                return False
            tol = rtol.get(str(x.dtype), 1e-3)
            flipped = mine != theirs
            try:
                a, b = (np.broadcast_to(v, mine.shape)[flipped].astype(np.float64) for v in (x, y))
            except ValueError:
                return False
        with np.errstate(all="ignore"):
            if not (np.abs(a - b) <= tol * np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-30)).all():
                return False
        fed[out] = mine
    redone = run(_fed(original, fed, []), {**feeds, **fed}, "with evonnx's near-tie choices")
    return redone is not None and matches(redone)


def _fed(original: onnx.ModelProto, fed: Mapping[str, np.ndarray], extra: list[str]) -> onnx.ModelProto:
    """`original` with the tensors `fed` names as graph inputs in place of the nodes that computed them, and
    `extra` as outputs too."""
    out = onnx.ModelProto()
    out.CopyFrom(original)
    keep = [n for n in out.graph.node if not any(o in fed for o in n.output)]
    del out.graph.node[:]
    out.graph.node.extend(keep)
    out.graph.input.extend(onnx.helper.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(v.dtype),
                                                              list(v.shape)) for k, v in fed.items())
    known = {o.name for o in out.graph.output}
    out.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in dict.fromkeys(extra)
                            if t not in known)
    return out


def _axis(node: onnx.NodeProto, rank: int) -> int:
    axis = next((int(a.i) for a in node.attribute if a.name == "axis"), -1)
    return axis + rank if axis < 0 else axis


def nms_near_ties(node: onnx.NodeProto, inputs: list[np.ndarray | None], mine: np.ndarray, theirs: np.ndarray,
                  tol: float) -> bool:
    """Whether the selection `mine` of a NonMaxSuppression differs from onnxruntime's `theirs` only by decisions
    onnxruntime's own boxes and scores (`inputs`, as the node reads them) take at a near tie: a score within `tol`
    of the score threshold or of another score (the order), an IoU within `tol` of the IoU threshold. Each class's
    selection must be a greedy NMS of those values where every decision that is no near tie goes onnxruntime's
    way: every box it selects a candidate, in score order, none suppressed by one selected before it, and every
    candidate it leaves out suppressed by one selected before it or past `max_output_boxes_per_class`.
    onnxruntime's own selection must pass the same test, so that a departure of this model of its arithmetic from
    onnxruntime's refuses the excuse instead of granting it. NaN scores or boxes refuse it too."""
    boxes, scores = inputs[0], inputs[1]
    if boxes is None or scores is None or boxes.dtype != np.float32 or scores.dtype != np.float32 \
            or boxes.ndim != 3 or scores.ndim != 3 or np.isnan(boxes).any() or np.isnan(scores).any():
        return False
    scalar = [None if (v := inputs[k] if k < len(inputs) else None) is None or v.size == 0 else float(v.ravel()[0])
              for k in (2, 3, 4)]
    top = int(scalar[0]) if scalar[0] is not None else 0
    iou = np.float32(scalar[1]) if scalar[1] is not None else np.float32(0)
    center = next((int(a.i) for a in node.attribute if a.name == "center_point_box"), 0)
    geom = _nms_geometry(boxes, center)
    for sel in (theirs, mine):
        if sel.ndim != 2 or sel.shape[1:] != (3,) or sel.dtype != np.int64:
            return False
        if (sel[:, 0] < 0).any() or (sel[:, 0] >= scores.shape[0]).any() or (sel[:, 1] < 0).any() \
                or (sel[:, 1] >= scores.shape[1]).any() or (sel[:, 2] < 0).any() or (sel[:, 2] >= boxes.shape[1]).any():
            return False
        for b in range(scores.shape[0]):
            for c in range(scores.shape[1]):
                picked = sel[(sel[:, 0] == b) & (sel[:, 1] == c), 2]
                if not _greedy_within(geom[b], scores[b, c], picked, top, iou, scalar[2], tol):
                    return False
    # selections batch by batch, class by class, as onnxruntime writes them
    order = mine[:, 0] * scores.shape[1] + mine[:, 1]
    return bool((np.diff(order) >= 0).all())


def _nms_geometry(boxes: np.ndarray, center: int) -> np.ndarray:
    """[B, N, 5]: xmin, xmax, ymin, ymax, area of each box as onnxruntime's SuppressByIOU derives them, in float32."""
    if center == 0:
        y1, x1, y2, x2 = (boxes[..., k] for k in range(4))
        xmin, xmax = np.where(x1 >= x2, x2, x1), np.where(x1 >= x2, x1, x2)
        ymin, ymax = np.where(y1 >= y2, y2, y1), np.where(y1 >= y2, y1, y2)
    else:
        hw, hh = boxes[..., 2] / np.float32(2), boxes[..., 3] / np.float32(2)
        xmin, xmax = boxes[..., 0] - hw, boxes[..., 0] + hw
        ymin, ymax = boxes[..., 1] - hh, boxes[..., 1] + hh
    with np.errstate(all="ignore"):
        return np.stack([xmin, xmax, ymin, ymax, (xmax - xmin) * (ymax - ymin)], axis=-1).astype(np.float32)


def _ious(g: np.ndarray, k: int, others: np.ndarray) -> np.ndarray:
    """IoU of box `k` with `others` (indices) as SuppressByIOU computes it, NaN where it never suppresses."""
    a, o = g[k], g[others]
    with np.errstate(all="ignore"):
        iw = np.minimum(a[1], o[:, 1]) - np.maximum(a[0], o[:, 0])
        ih = np.minimum(a[3], o[:, 3]) - np.maximum(a[2], o[:, 2])
        inter = iw * ih
        uni = (a[4] + o[:, 4]) - inter
        out = inter / uni
    never = (iw <= 0) | (ih <= 0) | (inter <= 0) | (a[4] <= 0) | (o[:, 4] <= 0) | (uni <= 0) | ~np.isfinite(out)
    return np.where(never, np.nan, out).astype(np.float32)


def _greedy_within(g: np.ndarray, s: np.ndarray, picked: np.ndarray, top: int, iou: np.float32,
                   threshold: float | None, tol: float) -> bool:
    """`nms_near_ties` for one batch and class: `picked` the box indices selected, in order."""
    def near(a: np.ndarray | float, b: float) -> np.ndarray:
        a64 = np.asarray(a, np.float64)
        return np.abs(a64 - b) <= tol * np.maximum(np.maximum(np.abs(a64), abs(b)), 1e-30)

    if len(set(picked.tolist())) != len(picked) or len(picked) > max(top, 0):
        return False
    thr = None if threshold is None else float(np.float32(threshold))
    surely = np.ones(s.shape, bool) if thr is None else (s > thr) & ~near(s, thr)
    maybe = np.ones(s.shape, bool) if thr is None else (s > thr) | near(s, thr)
    if not maybe[picked].all():
        return False
    scores = s.astype(np.float64)
    for t in range(1, len(picked)):  # in score order, up to near-equal scores
        if scores[picked[t]] > scores[picked[t - 1]] and not near(scores[picked[t]], scores[picked[t - 1]]):
            return False
    for t, k in enumerate(picked[1:], 1):  # none suppressed by one selected before it, up to near ties
        v = _ious(g, int(k), picked[:t])
        if ((v > iou) & ~near(v, float(iou))).any():
            return False
    left = np.flatnonzero(surely)
    left = left[~np.isin(left, picked)]
    if len(left) == 0:
        return True
    last = scores[picked[-1]] if len(picked) else np.inf
    for r in left:  # each candidate left out: suppressed by one selected before it, or past the limit
        before = picked[(scores[picked] > scores[r]) | near(scores[picked], scores[r])]
        v = _ious(g, int(r), before) if len(before) else np.zeros(0, np.float32)
        if ((v > iou) | near(v, float(iou))).any():
            continue
        if len(picked) == top and (scores[r] < last or near(scores[r], last)):
            continue
        return False
    return True


def from_empty_concat(original: onnx.ModelProto, name: str, feeds: Mapping[str, np.ndarray], run: Runner) -> bool:
    """Whether onnxruntime's output `name` depends on a Concat whose output holds more elements than its inputs
    together: bytes onnxruntime never wrote. It skips empty inputs when it checks their shapes, takes the output's
    dims from one of them, and fills it from wherever its input pointers lead ([2, 0, 3] with [2, 1, 0] on axis 2
    gives [2, 1, 6] of the first input's dims as int64, or of whatever memory lies there; fuzz seed 280022). An
    input of another rank than its inferred one does the same: ArgMax(x[1000, 0], axis=-1, keepdims=0) is [1000, 0]
    in onnxruntime, and a Concat of it with a [2] gives [1002], 2 elements written (fuzz case 185 of seed 954004).
    Both models compute that garbage in their own memory, so it differs between them."""
    concats = [n for n in original.graph.node if n.op_type == "Concat" and n.domain in ("", "ai.onnx")]
    if not concats:
        return False
    probe = onnx.ModelProto()
    probe.CopyFrom(original)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in dict.fromkeys(
        t for n in concats for t in [*n.input, n.output[0]] if t and t not in known))
    values = run(probe, feeds, "for the inputs of its Concats")
    if values is None:
        return False
    reached = {n.output[0] for n in concats if values[n.output[0]].size > sum(values[t].size for t in n.input if t)}
    for n in original.graph.node:  # in graph order: everything computed from such a Concat
        if reached and any(t in reached for t in n.input):
            reached.update(n.output)
    return name in reached


_DECISIONS = ("Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal", "Cast", "ArgMax", "ArgMin")


def flipped_decisions(original: onnx.ModelProto, name: str, feeds: Mapping[str, np.ndarray], ref: np.ndarray,
                      got: np.ndarray, run: Runner, rtol: Mapping[str, float]) -> int:
    """How many elements of the integer or bool output `name` of an inexact kernel differ from onnxruntime's `ref`
    as a decision on floats a rounding error from its threshold, where every difference is one; 0 otherwise.
    `name` is a comparison, a Cast to an integer, or an ArgMax/ArgMin of floats; where the outputs differ,
    onnxruntime's operands on the original are within the float tolerance (`rtol`, by dtype) of each other (a
    comparison), of an integer (a Cast), or the element evonnx picked is within it of the one onnxruntime picked
    (an ArgMax/ArgMin: fuzz case 2118, an exp rounded to float16 one ulp apart decided between two near-equal
    values). A last-bit difference of evonnx's exp against onnxruntime's flips such a decision; any other
    difference is a mismatch."""
    node = next((n for n in original.graph.node if name in n.output), None)
    if node is None or node.domain not in ("", "ai.onnx"):
        return 0
    if node.op_type in _MOVES:
        return _moved_flips(original, name, feeds, ref, got, run, rtol)
    if node.op_type not in _DECISIONS:
        return 0
    operands = list(node.input[:1] if node.op_type in ("Cast", "ArgMax", "ArgMin") else node.input[:2])
    probe = onnx.ModelProto()
    probe.CopyFrom(original)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in operands if t not in known)
    values = run(probe, feeds, "for the operands of a decision")
    if values is None or any(np.asarray(values[t]).dtype.kind != "f" for t in operands):
        return 0
    tol = rtol.get(str(np.asarray(values[operands[0]]).dtype), 1e-3)
    bad = ref != got
    if node.op_type in ("ArgMax", "ArgMin"):
        x = np.asarray(values[operands[0]])
        pair = _picked(node, x, ref, got)
        if pair is None:
            return 0
        a, b = pair
    else:
        try:
            arrays = [np.broadcast_to(np.asarray(values[t]), ref.shape).astype(np.float64) for t in operands]
        except ValueError:
            return 0
        a = arrays[0][bad]
        b = np.round(a) if node.op_type == "Cast" else arrays[1][bad]
    with np.errstate(all="ignore"):
        floor = 1.0 if node.op_type == "Cast" else 1e-30
        near = np.abs(a - b) <= tol * np.maximum(np.maximum(np.abs(a), np.abs(b)), floor)
    return int(bad.sum()) if near.all() else 0


def _moved_flips(original: onnx.ModelProto, name: str, feeds: Mapping[str, np.ndarray], ref: np.ndarray,
                 got: np.ndarray, run: Runner, rtol: Mapping[str, float]) -> int:
    """`flipped_decisions` of a bool output that moves comparisons (a Transpose, Reshape or Concat of them): the
    original is run with each comparison replaced by whether its operands are within the float tolerance of each
    other, so the moves carry that to the output's positions; every differing element must be such a one."""
    comparisons = _decided_by_comparisons(original, name, _MOVES)
    if ref.dtype != bool or not comparisons:
        return 0
    try:
        typed = infer_shapes(original)
    except Exception:  # noqa: BLE001 - no types, no excuse
        return 0
    types = {v.name: v.type.tensor_type.elem_type for v in [*typed.graph.input, *typed.graph.value_info,
                                                            *typed.graph.output, *typed.graph.initializer]
             if hasattr(v, "type")}
    types.update({t.name: t.data_type for t in typed.graph.initializer})
    probe = onnx.ModelProto()
    probe.CopyFrom(original)
    taken = {t for n in probe.graph.node for t in [*n.input, *n.output]}
    for k, c in enumerate(comparisons):
        elem = types.get(c.input[0])
        if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
            return 0
        tol = rtol.get(str(onnx.helper.tensor_dtype_to_np_dtype(elem)), 1e-3)
        t = [f"evonnx_near{k}_{i}" for i in range(9)]
        if taken & set(t):
            return 0
        out = probe.graph.node[list(original.graph.node).index(c)]
        near_of, out.output[0] = out.output[0], t[8]
        f64 = onnx.TensorProto.DOUBLE
        probe.graph.node.extend([
            onnx.helper.make_node("Cast", [c.input[0]], [t[0]], to=f64),
            onnx.helper.make_node("Cast", [c.input[1]], [t[1]], to=f64),
            onnx.helper.make_node("Sub", [t[0], t[1]], [t[2]]), onnx.helper.make_node("Abs", [t[2]], [t[3]]),
            onnx.helper.make_node("Abs", [t[0]], [t[4]]), onnx.helper.make_node("Abs", [t[1]], [t[5]]),
            onnx.helper.make_node("Max", [t[4], t[5], f"evonnx_near{k}_floor"], [t[6]]),
            onnx.helper.make_node("Mul", [t[6], f"evonnx_near{k}_tol"], [t[7]]),
            onnx.helper.make_node("LessOrEqual", [t[3], t[7]], [near_of])])
        probe.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(1e-30), f"evonnx_near{k}_floor"),
                                        onnx.numpy_helper.from_array(np.array(tol), f"evonnx_near{k}_tol")])
    values = run(probe, feeds, "with its comparisons' margins")  # onnxruntime sorts the nodes itself
    near = None if values is None else np.asarray(values.get(name))
    if near is None or near.dtype != bool or near.shape != ref.shape:
        return 0
    bad = ref != got
    return int(bad.sum()) if bool(near[bad].all()) else 0


def _picked(node: onnx.NodeProto, x: np.ndarray, ref: np.ndarray,
            got: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The values of `x` an ArgMax/ArgMin picked in onnxruntime (`ref`) and in evonnx (`got`), where they differ;
    None where the indices do not fit `x`."""
    attrs = {a.name: int(a.i) for a in node.attribute}
    axis = attrs.get("axis", 0)
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis < x.ndim or ref.dtype.kind not in "iu" or ref.shape != got.shape:
        return None
    theirs, mine = (ref, got) if attrs.get("keepdims", 1) else (np.expand_dims(ref, axis), np.expand_dims(got, axis))
    if theirs.ndim != x.ndim or ((mine < 0) | (mine >= x.shape[axis]) | (theirs < 0) | (theirs >= x.shape[axis])).any():
        return None
    bad = theirs != mine
    a = np.take_along_axis(x, theirs.astype(np.int64), axis).astype(np.float64)[bad]
    b = np.take_along_axis(x, mine.astype(np.int64), axis).astype(np.float64)[bad]
    return a, b


_COMPARISONS = {"Greater": np.greater, "Less": np.less, "GreaterOrEqual": np.greater_equal,
                "LessOrEqual": np.less_equal, "Equal": np.equal}


# ops whose bool output is a function of the decisions in their bool inputs (by position): moves and logic, with the
# inputs that carry the decisions
_BOOL_CARRIERS = {"Transpose": (0,), "Reshape": (0,), "Flatten": (0,), "Squeeze": (0,), "Unsqueeze": (0,),
                  "Identity": (0,), "Expand": (0,), "Slice": (0,), "Tile": (0,), "Gather": (0,),
                  "GatherElements": (0,), "ScatterND": (0, 2), "ScatterElements": (0, 2), "Where": (0, 1, 2),
                  "Concat": None, "Split": (0,), "Not": (0,), "And": (0, 1), "Or": (0, 1), "Xor": (0, 1)}


_MOVES = {op: carried for op, carried in _BOOL_CARRIERS.items() if op not in ("Where", "Not", "And", "Or", "Xor")}


def _decided_by_comparisons(original: onnx.ModelProto, name: str,
                            carriers: Mapping[str, tuple[int, ...] | None] = _BOOL_CARRIERS) -> list[onnx.NodeProto]:
    """The comparisons the bool tensor `name` is computed from by moves and logic alone (a Transpose of a
    GreaterOrEqual: fuzz case 3078); [] where it is computed otherwise."""
    producer = {t: n for n in original.graph.node for t in n.output}
    todo, seen, compared = [name], set(), []
    while todo:
        t = todo.pop()
        node = producer.get(t)
        if t in seen or node is None:  # a graph input or initializer: the same in both runs
            continue
        seen.add(t)
        if node.domain not in ("", "ai.onnx"):
            return []
        if node.op_type in _COMPARISONS:
            compared.append(node)
        elif node.op_type == "Constant":
            continue
        elif node.op_type in carriers:
            carried = carriers[node.op_type]
            todo.extend(x for i, x in enumerate(node.input) if x and (carried is None or i in carried))
        else:
            return []
    return compared


def decided_as_in_float64(original: onnx.ModelProto, name: str, feeds: Mapping[str, np.ndarray],
                          ref: np.ndarray, got: np.ndarray, run: Runner,
                          widen: Callable[[onnx.ModelProto], onnx.ModelProto | None]) -> int:
    """How many elements of the bool output `name`, comparisons of floats moved or combined by logic, the optimized
    model decides otherwise than onnxruntime but as the original computed in float64 (`widen`, the check's
    `references.as_float64`) decides, where it so decides every differing element; 0 otherwise. A ReduceSum of
    65,537 float32 values in onnxruntime's order is 0.01 off its float64 sum of 521.71, and a GreaterOrEqual of it
    against one of the values flips (fuzz case 9483); evonnx sums in double. The decision's counterpart of the
    check's closer-than-onnxruntime rule for float outputs."""
    comparisons = _decided_by_comparisons(original, name) if ref.dtype == bool else []
    wide = widen(original) if comparisons else None
    if wide is None:
        return 0
    operands = list(dict.fromkeys(t for n in comparisons for t in n.input[:2]))
    known = {o.name for o in wide.graph.output}
    wide.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in operands if t not in known)
    values = run(wide, {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()},
                 "in float64 for its decisions")
    if values is None or name not in values or any(np.asarray(values[t]).dtype != np.float64 for t in operands):
        return 0
    decided = np.asarray(values[name])
    if decided.dtype != bool or decided.shape != ref.shape:
        return 0
    bad = ref != got
    return int(bad.sum()) if bool(np.array_equal(decided[bad], got[bad])) else 0


# Decisions on float values: a result that jumps where its float operand crosses a threshold (an integer for a
# Cast or a rounding, the other operand for a comparison, a neighbour for an arg-extreme or a top-k)
_JUMPS = (*_DECISIONS, "TopK", "Floor", "Ceil", "Round", "Sign")
_TWO_OPERANDS = ("Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal")  # the others decide on input 0
# ONNX ops whose float results evonnx computes with other last bits than onnxruntime's: its own exp, log, sigmoid
# and the like, and sums taken in another order
_INEXACT = ("Exp", "Log", "Sigmoid", "Tanh", "Erf", "Sin", "Cos", "Softplus", "Softmax", "LogSoftmax", "Pow",
            "ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
            "ReduceLogSumExp", "ReduceProd", "MatMul", "Conv", "Gemm", "HardSwish", "HardSigmoid", "Mean", "Sum")


def decided_on_inexact(original: onnx.ModelProto, output: str) -> set[str]:
    """The nodes of `original` (by name) that compute the operands of the decisions `output` depends on, where
    one of them is inexact (`_INEXACT`): with those left to onnxruntime, every such decision sees onnxruntime's
    own bits. A decision whose result only selects (a GatherElements index of Mod(Cast(Exp(x)), 4), fuzz case
    1220: an exp above 2^24 one ulp apart is another integer) moves an output by far more than any tolerance, where
    evonnx's kernel is right to its own last bit. Empty where no such decision is upstream of `output`."""
    producer = {t: n for n in original.graph.node for t in n.output if t}

    def upstream(names: list[str]) -> list[onnx.NodeProto]:
        seen: dict[str, onnx.NodeProto] = {}
        stack = [t for t in names if t in producer]
        while stack:
            n = producer[stack.pop()]
            if n.name not in seen:
                seen[n.name] = n
                stack.extend(t for t in n.input if t in producer)
        return list(seen.values())

    out: set[str] = set()
    for d in upstream([output]):
        if d.op_type in _JUMPS and d.domain in ("", "ai.onnx"):
            operands = upstream(list(d.input[:2] if d.op_type in _TWO_OPERANDS else d.input[:1]))
            if any(n.op_type in _INEXACT for n in operands):
                out.update(n.name for n in operands)
    return out
