"""NonMaxSuppression as evonnx's op (issue 14): the optimized model selects exactly what onnxruntime's CPU
NonMaxSuppression selects on the original, in the same order, or fails where it fails.

Property tests draw boxes with ties, duplicates, NaN and infinite scores and coordinates, zero-area, inverted and
huge boxes, thresholds at a pair's exact IoU and one ulp either side, and every form of the optional inputs; the
oracle is onnxruntime on the original model, case by case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper

import evonnx
from evonnx.api import library_path
from evonnx.model import DOMAIN
from evonnx.passes.nms import replace_nms

pytestmark = pytest.mark.compiler

OPTIONAL = (("max_output", T.INT64), ("iou", T.FLOAT), ("score", T.FLOAT))


def _nms_model(path: Path, center_point_box: int, given: int, opset: int = 13) -> Path:
    """One NonMaxSuppression reading graph inputs: boxes, scores and the first `given` optional inputs."""
    inputs = [helper.make_tensor_value_info("boxes", T.FLOAT, ["B", "N", 4]),
              helper.make_tensor_value_info("scores", T.FLOAT, ["B", "C", "N"])]
    inputs += [helper.make_tensor_value_info(name, ty, [1]) for name, ty in OPTIONAL[:given]]
    node = helper.make_node("NonMaxSuppression", [i.name for i in inputs], ["selected"], name="nms",
                            center_point_box=center_point_box)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("selected", T.INT64, ["K", 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), str(path))
    return path


class Pair:
    """The original model in onnxruntime and the optimized one with its library, run on the same feeds."""

    def __init__(self, src: Path) -> None:
        dst = src.with_name(src.stem + ".opt.onnx")
        result = evonnx.optimize(src, dst, guard=False)
        assert result.nms == ["nms"] and "1 NonMaxSuppression run by evonnx's op: nms" in result.summary()
        ops = [(n.op_type, n.domain) for n in onnx.load(str(dst)).graph.node]
        assert ops == [("NonMaxSuppression", DOMAIN)], ops
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2  # the (batch, class) pairs run on the pool
        so.register_custom_ops_library(str(library_path(dst)))
        self.original = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
        self.optimized = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])

    def compare(self, feeds: dict[str, np.ndarray]) -> str:
        """'' where both give the same rows or both fail, else what differs."""
        results = []
        for sess in (self.original, self.optimized):
            try:
                results.append(sess.run(None, feeds)[0])
            except Exception as e:  # noqa: BLE001 - onnxruntime raises several types
                results.append(str(e))
        a, b = results
        if isinstance(a, str) or isinstance(b, str):
            return "" if isinstance(a, str) and isinstance(b, str) else f"one failed: {a!s:.200} / {b!s:.200}"
        if a.shape != b.shape or not np.array_equal(a, b):
            return f"onnxruntime {a.tolist()[:12]} ({len(a)} rows), evonnx {b.tolist()[:12]} ({len(b)} rows)"
        return ""


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], Pair]:
    folder = tmp_path_factory.mktemp("nms")
    return {(cpb, given): Pair(_nms_model(folder / f"nms_{cpb}_{given}.onnx", cpb, given))
            for cpb in (0, 1) for given in (0, 1, 3)}


def _iou(a: np.ndarray, b: np.ndarray, cpb: int) -> np.float32:
    """The float32 IoU of two boxes as onnxruntime computes it (for thresholds right at a pair's IoU)."""
    f = np.float32
    with np.errstate(all="ignore"):
        if cpb == 0:
            ax, bx = sorted((a[1], a[3])), sorted((b[1], b[3]))
            ay, by = sorted((a[0], a[2])), sorted((b[0], b[2]))
        else:
            ax, ay = (a[0] - a[2] / f(2), a[0] + a[2] / f(2)), (a[1] - a[3] / f(2), a[1] + a[3] / f(2))
            bx, by = (b[0] - b[2] / f(2), b[0] + b[2] / f(2)), (b[1] - b[3] / f(2), b[1] + b[3] / f(2))
        inter = (min(ax[1], bx[1]) - max(ax[0], bx[0])) * (min(ay[1], by[1]) - max(ay[0], by[0]))
        union = ((ax[1] - ax[0]) * (ay[1] - ay[0]) + (bx[1] - bx[0]) * (by[1] - by[0])) - inter
        return f(inter / union)


def _case(rng: np.random.Generator, cpb: int, n_max: int) -> dict[str, np.ndarray]:
    batches, classes = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    n = int(rng.choice([0, 1, 2, 3, 5, 8, 17, 40, 120, n_max]))
    kind = rng.integers(0, 5)
    if kind == 0:  # a small integer grid: ties, duplicates, exact overlaps
        boxes = rng.integers(0, 6, (batches, n, 4)).astype(np.float32)
        if cpb == 1:
            boxes[..., 2:] = rng.integers(-1, 5, (batches, n, 2))
    elif kind == 1:
        boxes = rng.random((batches, n, 4), dtype=np.float32) * 10
    elif kind == 2:  # jitter around one box: IoUs near every threshold
        boxes = (rng.random(4) * 10 + rng.normal(0, 0.3, (batches, n, 4))).astype(np.float32)
    elif kind == 3:  # special values
        pool = np.array([0, 1, 2, -1, np.nan, np.inf, -np.inf, 0.5, 3, 1e-30, 1e30, -0.0], np.float32)
        boxes = rng.choice(pool, (batches, n, 4)).astype(np.float32)
    else:  # the class-offset layout of torchvision's batched NMS: many boxes, far apart by class
        xy = rng.random((batches, n, 2), dtype=np.float32) * 100 + rng.integers(0, 20, (batches, n, 1)) * 200
        wh = rng.random((batches, n, 2), dtype=np.float32) * 30
        boxes = np.concatenate([xy, xy + wh] if cpb == 0 else [xy, wh], axis=-1).astype(np.float32)
    sk = rng.integers(0, 3)
    if sk == 0:
        scores = rng.integers(0, 4, (batches, classes, n)).astype(np.float32) / 4
    elif sk == 1:
        scores = rng.random((batches, classes, n), dtype=np.float32)
    else:
        scores = rng.choice(np.array([0, 0.5, 1, np.nan, -0.0, np.inf, -np.inf], np.float32), (batches, classes, n))
    iou = np.float32(rng.choice([0, 0.3, 0.5, 0.7, 1]))
    if n > 1 and rng.random() < 0.5:
        i, j = rng.choice(n, 2, replace=False)
        v = _iou(boxes[0, i], boxes[0, j], cpb)
        if np.isfinite(v) and 0 <= v <= 1:
            iou = np.float32(np.clip(rng.choice([v, np.nextafter(v, np.float32(2)), np.nextafter(v, np.float32(-1))]),
                                     0, 1))
    return {"boxes": boxes.reshape(batches, n, 4), "scores": scores.reshape(batches, classes, n),
            "max_output": np.array([rng.choice([-1, 0, 1, 2, 3, 5, 1000, 2**63 - 1])], np.int64),
            "iou": np.array([iou], np.float32),
            "score": np.array([rng.choice([0, 0.25, 0.5, -np.inf, np.nan])], np.float32)}


@pytest.mark.parametrize("cpb", [0, 1])
@pytest.mark.parametrize("given", [0, 1, 3])
def test_random_cases_match_onnxruntime(pairs: dict, cpb: int, given: int) -> None:
    pair = pairs[(cpb, given)]
    rng = np.random.default_rng(1000 * cpb + given)
    names = ["boxes", "scores", *(name for name, _ in OPTIONAL[:given])]
    bad = []
    for k in range(400):
        feeds = {name: value for name, value in _case(rng, cpb, 400).items() if name in names}
        if diff := pair.compare(feeds):
            bad.append(f"case {k}: {diff}")
    assert not bad, f"{len(bad)} of 400 cases differ; first: {bad[0]}"


@pytest.mark.parametrize("cpb", [0, 1])
def test_thousands_of_boxes_match(pairs: dict, cpb: int) -> None:
    """Sizes where the grid has many cells: dense overlapping boxes, the class-offset layout, duplicates, ties."""
    pair = pairs[(cpb, 3)]
    rng = np.random.default_rng(7 + cpb)
    for n, spread, classes in ((3000, 300, 1), (5000, 4000, 1), (2000, 300, 5), (4000, 50, 1)):
        xy = rng.random((1, n, 2), dtype=np.float32) * spread
        wh = rng.random((1, n, 2), dtype=np.float32) * 40 + 1
        boxes = np.concatenate([xy, xy + wh] if cpb == 0 else [xy + wh / 2, wh], axis=-1).astype(np.float32)
        boxes[0, n // 2:n // 2 + 50] = boxes[0, :50]  # exact duplicates
        scores = np.round(rng.random((1, classes, n), dtype=np.float32), 2)  # many ties
        for iou in (0.0, 0.45, 0.7):
            for score in (0.0, 0.6):
                feeds = {"boxes": boxes, "scores": scores, "max_output": np.array([2**63 - 1], np.int64),
                         "iou": np.array([iou], np.float32), "score": np.array([score], np.float32)}
                assert not (diff := pair.compare(feeds)), f"n={n} iou={iou} score={score}: {diff}"


def test_spec_examples_and_errors(pairs: dict) -> None:
    """The ONNX specification's example, onnxruntime's error cases, and inputs where its heap order with NaN
    scores is not a sort's."""
    pair = pairs[(0, 3)]
    std = np.array([[[0, 0, 1, 1], [0, .1, 1, 1.1], [0, -.1, 1, .9], [0, 10, 1, 11], [0, 10.1, 1, 11.1],
                     [0, 100, 1, 101]]], np.float32)
    disjoint = np.array([[[0, 2 * k, 1, 2 * k + 1] for k in range(5)]], np.float32)
    nan = np.float32(np.nan)
    cases = [
        (std, [[[.9, .75, .6, .95, .5, .3]]], 3, .5, 0.0),
        (disjoint, [[[.5, .7, nan, nan, .9]]], 10, .5, nan),  # a NaN threshold drops everything
        (std, [[[.9, .75, .6, .95, .5, .3]]], 3, -0.1, 0.0),  # iou out of [0, 1]: both fail
        (std, [[[.9, .75, .6, .95, .5, .3]]], 0, 2.0, 0.0),  # checked before M = 0 returns
        (std, [[[.9, .75, .6, .95, .5, .3]]], 3, nan, 0.0),
        (std[:, :, :3], [[[.9, .75, .6, .95, .5, .3]]], 3, .5, 0.0),  # boxes' last dim is not 4
        (std, [[[.9, .75, .6, .95, .5]]], 3, .5, 0.0),  # spatial dims differ
        (np.zeros((0, 3, 4), np.float32), np.zeros((0, 2, 3), np.float32), 3, .5, 0.0),
    ]
    expected = [[3, 0, 5], None, "fail", "fail", "fail", "fail", "fail", []]
    for (boxes, scores, m, iou, score), want in zip(cases, expected, strict=True):
        feeds = {"boxes": np.asarray(boxes, np.float32), "scores": np.asarray(scores, np.float32),
                 "max_output": np.array([m], np.int64), "iou": np.array([iou], np.float32),
                 "score": np.array([score], np.float32)}
        assert not (diff := pair.compare(feeds)), diff
        try:  # the premise: what onnxruntime itself does on these
            got = pair.original.run(None, feeds)[0][:, 2].tolist()
        except Exception:  # noqa: BLE001
            got = "fail"
        if want is not None:
            assert got == want
    nan_heap = pairs[(0, 1)]  # no score threshold: NaN scores reach the priority queue
    for scores in ([.5, .7, nan, nan, .9], [nan, .5, .7, .1, .9], [.1, .2, .3, .4, nan]):
        feeds = {"boxes": disjoint, "scores": np.array([[scores]], np.float32),
                 "max_output": np.array([10], np.int64)}
        assert not (diff := nan_heap.compare(feeds)), diff
    got = nan_heap.original.run(None, {"boxes": disjoint, "scores": np.array([[[.5, .7, nan, nan, .9]]], np.float32),
                                       "max_output": np.array([10], np.int64)})[0][:, 2].tolist()
    assert got == [2, 4, 1, 3, 0]  # not a sort's order: the heap's


def test_nms_in_an_if_branch_and_unsupported_attributes(tmp_path: Path) -> None:
    """torchvision's batched NMS sits in an If branch: it is replaced there. A center_point_box onnxruntime refuses
    stays with onnxruntime, so the optimized model is refused alike."""
    boxes = helper.make_tensor_value_info("boxes", T.FLOAT, [1, "N", 4])
    scores = helper.make_tensor_value_info("scores", T.FLOAT, [1, 1, "N"])
    flag = helper.make_tensor_value_info("flag", T.BOOL, [])
    m = helper.make_tensor("m", T.INT64, [1], [100])
    branch = helper.make_graph([helper.make_node("NonMaxSuppression", ["boxes", "scores", "m"], ["sel"],
                                                 name="inner_nms")],
                               "then", [], [helper.make_tensor_value_info("sel", T.INT64, ["K", 3])])
    other = helper.make_graph([helper.make_node("Constant", [], ["none"], value_ints=[0, 3]),
                               helper.make_node("ConstantOfShape", ["none"], ["empty"],
                                                value=helper.make_tensor("v", T.INT64, [1], [0]))],
                              "else", [], [helper.make_tensor_value_info("empty", T.INT64, ["K", 3])])
    node = helper.make_node("If", ["flag"], ["out"], name="if", then_branch=branch, else_branch=other)
    graph = helper.make_graph([node], "g", [boxes, scores, flag],
                              [helper.make_tensor_value_info("out", T.INT64, ["K", 3])], [m])
    src = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(src))
    dst = tmp_path / "if.opt.onnx"
    evonnx.optimize(src, dst, guard=False)
    then = onnx.load(str(dst)).graph.node[0].attribute
    inner = [n for a in then if a.name == "then_branch" for n in a.g.node]
    assert [(n.op_type, n.domain) for n in inner] == [("NonMaxSuppression", DOMAIN)]
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library_path(dst)))
    opt = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    xy = rng.random((1, 500, 2), dtype=np.float32) * 50
    feeds = {"boxes": np.concatenate([xy, xy + 5], -1), "scores": rng.random((1, 1, 500), dtype=np.float32),
             "flag": np.array(True)}
    assert np.array_equal(opt.run(None, feeds)[0], ref.run(None, feeds)[0])

    bad = _nms_model(tmp_path / "cpb2.onnx", 2, 3)
    assert replace_nms(gs.import_onnx(onnx.load(str(bad)))) == []
    assert replace_nms(gs.import_onnx(onnx.load(str(_nms_model(tmp_path / "ok.onnx", 1, 3, opset=10))))) == ["nms"]
    assert replace_nms(gs.import_onnx(onnx.load(str(_nms_model(tmp_path / "left.onnx", 0, 3)))),
                       {"nms": "left by the guard"}) == []


def test_the_guard_times_a_model_whose_only_change_is_nms(tmp_path: Path) -> None:
    """A model with no kernel but an evonnx NonMaxSuppression is still timed against the original, and what the
    guard decides is reported (kept: the op stays; slower: the original is written)."""
    src = _nms_model(tmp_path / "nms.onnx", 0, 3)
    result = evonnx.optimize(src, tmp_path / "nms.opt.onnx", guard=True, guard_seconds=0.2)
    assert result.guard is not None and result.guard.note != "nothing to time (no kernel)", result.guard
    assert result.guard.comparisons or result.guard.dropped, result.guard
    written = [(n.op_type, n.domain) for n in onnx.load(str(tmp_path / "nms.opt.onnx")).graph.node]
    assert written == [("NonMaxSuppression", DOMAIN if result.nms else "")], (written, result.guard)
