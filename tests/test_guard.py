"""The never-slower guard (issue 9): `evonnx optimize` times the optimized model against the original and, while it
loses beyond noise, leaves kernels to onnxruntime in stages, ending with the original model.

The decisions are tested with `compare_models` replaced by a scripted one (a timed test would assert on the
machine, not on the code); one run with the real measurement checks that it reports what it measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import evonnx
import evonnx.api as api
import evonnx.guard as guard
from evonnx.measure import Comparison

pytestmark = pytest.mark.compiler


def _cmp(ratio: float, noise: float = 0.01, threads: int = 1) -> Comparison:
    return Comparison(threads, {"median_us": 100.0 * ratio}, {"median_us": 100.0}, ratio, noise)


def _conv_model(tmp_path: Path) -> Path:
    """x -> Neg -> Abs (a kernel feeding a Conv) -> Conv -> Transpose -> Sigmoid -> Add 1 (a kernel reading it) -> y.
    (A Sigmoid right after the Conv would stay with onnxruntime, which folds it into the convolution.)"""
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="neg"), helper.make_node("Abs", ["a"], ["b"], name="abs"),
             helper.make_node("Conv", ["b", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], name="transpose", perm=[0, 1, 3, 2]),
             helper.make_node("Sigmoid", ["t"], ["s"], name="sig"), helper.make_node("Add", ["s", "one"], ["y"],
                                                                                      name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
                          [w, numpy_helper.from_array(np.array(1, np.float32), "one")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _scripted(monkeypatch: pytest.MonkeyPatch, ratios: list[float]) -> list[int]:
    """compare_models answers `ratios` in turn (one per call); returns the kernel counts it was called with."""
    calls: list[int] = []

    def fake(original: bytes, optimized: Path, library: Path, feeds: dict, *, threads: int = 1,
             seconds: float = 1.0, rounds: int = 10) -> Comparison:
        calls.append(sum(n.op_type == "Fused" for n in onnx.load(optimized).graph.node))
        return _cmp(ratios[min(len(calls) - 1, len(ratios) - 1)], threads=threads)

    monkeypatch.setattr(guard, "compare_models", fake)
    monkeypatch.setattr(guard.os, "cpu_count", lambda: 1)  # one comparison per build
    _profiled(monkeypatch, {})
    return calls


def _profiled(monkeypatch: pytest.MonkeyPatch, kernel_us: dict[str, float], node_us: float = 10.0) -> None:
    """profile_nodes answers `node_us` for every node of a model without kernels, and `kernel_us` for a kernel of
    the optimized model by one of its output tensors (a kernel not named there has no entry: never dropped)."""
    from evonnx.measure import NodeProfile

    def fake(model: object, library: object, feeds: dict, *, threads: int = 1, runs: int = 20,
             warmup: int = 3) -> NodeProfile:
        m = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
        if library is None:
            return NodeProfile({n.name: node_us for n in m.graph.node}, {n.name: n.op_type for n in m.graph.node},
                               node_us * len(m.graph.node))
        times = {n.name: kernel_us[o] for n in m.graph.node if n.op_type == "Fused" for o in n.output
                 if o in kernel_us}
        return NodeProfile(times, {k: "Fused" for k in times}, sum(times.values()))

    monkeypatch.setattr(guard, "profile_nodes", fake)


def test_slower_below_the_floor_whatever_the_spread() -> None:
    assert _cmp(0.90).slower
    assert not _cmp(0.99).slower  # within the 2% floor
    assert _cmp(0.95, noise=0.08).slower  # a wide spread is no excuse (FCOS measured 0.886x at +-13% under load)
    assert not _cmp(0.985, noise=0.2).slower
    assert not _cmp(1.3).slower


def test_a_faster_model_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _scripted(monkeypatch, [1.5])
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o.onnx", guard=True)
    assert calls == [2] and len(res.kernels) == 2
    assert res.guard is not None and not res.guard.dropped and res.guard.comparisons[0].ratio == 1.5


def test_stages_leave_kernels_to_onnxruntime_until_not_slower(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _scripted(monkeypatch, [0.8, 1.1])
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o.onnx", guard=True, report=tmp_path / "r.json")
    # first the kernel feeding the Conv goes, then the model measures faster and the other kernel stays
    assert calls == [2, 1]
    assert [k.source_ops for k in res.kernels] == [("Transpose", "Sigmoid", "Add")]
    assert res.guard is not None and [(w, n) for w, n, _ in res.guard.dropped] == [(api.GUARD_STAGES[1][1], 1)]
    rejected = {r.node: r.reason for r in res.plan.rejected}
    assert "never-slower guard" in rejected["neg"] and "0.800x" in rejected["neg"]
    assert "left kernels whose outputs feed" in str(res.guard)
    report = (tmp_path / "r.json").read_text()
    assert '"dropped"' in report and "0.800x" in report


def test_a_kernel_slower_than_the_nodes_it_replaces_goes_first(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # onnxruntime's profiler: the Neg+Abs kernel takes 25 us where its two nodes took 10 us each; the
    # Transpose+Sigmoid+Add kernel 5 us for three nodes. Only the first goes back to onnxruntime.
    calls = _scripted(monkeypatch, [0.9, 1.2])
    _profiled(monkeypatch, {"b": 25.0, "y": 5.0})
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o.onnx", guard=True)
    assert calls == [2, 1]
    assert [k.source_ops for k in res.kernels] == [("Transpose", "Sigmoid", "Add")]
    assert res.guard is not None and [(w, n) for w, n, _ in res.guard.dropped] == [(api.GUARD_STAGES[0][1], 1)]
    assert "kernels slower than the nodes they replace" in str(res.guard)


def test_a_tie_below_one_tries_without_the_slower_kernels_and_keeps_the_faster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 0.99x is a tie (within the 2% floor) but a loss: the plan without the kernel onnxruntime's profiler finds
    # slower than its nodes is built, checked and timed, and the faster of the two is written
    calls = _scripted(monkeypatch, [0.99, 0.99, 1.2])
    _profiled(monkeypatch, {"b": 25.0, "y": 5.0})
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o.onnx", guard=True)
    assert calls == [2, 2, 1]  # the tie confirmed (a narrow result is timed twice), then the trial
    assert [k.source_ops for k in res.kernels] == [("Transpose", "Sigmoid", "Add")]
    assert res.guard is not None and [(w, n) for w, n, _ in res.guard.dropped] == [(api.GUARD_STAGES[0][1], 1)]
    assert res.guard.comparisons[0].ratio == 1.2 and not res.guard.declined
    assert "tie of 0.990x" in {r.node: r.reason for r in res.plan.rejected}["neg"]
    # the trial measures worse: the tied plan and its files are written back, and the summary says why
    calls = _scripted(monkeypatch, [0.99, 0.99, 0.97])
    _profiled(monkeypatch, {"b": 25.0, "y": 5.0})
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o2.onnx", guard=True, report=tmp_path / "r.json")
    assert calls == [2, 2, 1] and len(res.kernels) == 2
    assert sum(n.op_type == "Fused" for n in onnx.load(tmp_path / "o2.onnx").graph.node) == 2
    assert res.guard is not None and not res.guard.dropped and res.guard.comparisons[0].ratio == 0.99
    assert "kept kernels slower than the nodes they replace" in str(res.guard) and "0.970x" in str(res.guard)
    assert '"kept_after_trial"' in (tmp_path / "r.json").read_text()
    sess = evonnx.load_session(tmp_path / "o2.onnx")  # the library written back is the one built for it
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    assert sess.run(None, {"x": x})[0].shape == (1, 4, 16, 16)
    # no kernel slower than its nodes: nothing to try, the tie stands
    calls = _scripted(monkeypatch, [0.99])
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o3.onnx", guard=True)
    assert calls == [2, 2] and len(res.kernels) == 2
    assert res.guard is not None and not res.guard.dropped and not res.guard.declined


def test_a_narrow_win_is_confirmed_and_the_lower_ratio_stands(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # 1.03x once, 0.85x when timed again (a shared machine's drift): the kernels go to onnxruntime
    calls = _scripted(monkeypatch, [1.03, 0.85, 1.2])
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o.onnx", guard=True)
    assert calls == [2, 2, 1]
    assert res.guard is not None and len(res.guard.dropped) == 1 and "0.850x" in res.guard.dropped[0][2]
    calls = _scripted(monkeypatch, [1.03, 1.04])  # confirmed: kept, at the lower ratio
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o2.onnx", guard=True)
    assert calls == [2, 2] and len(res.kernels) == 2
    assert res.guard is not None and not res.guard.dropped and res.guard.comparisons[0].ratio == 1.03
    # 1.12x +-6.5%: clear of 1.05x, but twice its noise reaches below 1.0x, so it is timed again too
    fakes = iter([_cmp(1.12, noise=0.065), _cmp(0.93, noise=0.01), _cmp(1.2)])
    timed: list[int] = []

    def noisy(*args: object, **kwargs: object) -> Comparison:
        timed.append(1)
        return next(fakes)

    monkeypatch.setattr(guard, "compare_models", noisy)
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o3.onnx", guard=True)
    assert len(timed) == 3 and res.guard is not None and "0.930x" in res.guard.dropped[0][2]


def test_always_slower_ends_with_the_original_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _scripted(monkeypatch, [0.8])
    src = _conv_model(tmp_path)
    res = evonnx.optimize(src, tmp_path / "o.onnx", guard=True)
    assert calls == [2, 1]  # every stage with a suspect was built and timed; the last leaves every kernel
    assert res.kernels == [] and res.guard is not None and len(res.guard.dropped) == 2
    written = onnx.load(tmp_path / "o.onnx")
    assert [n.name for n in written.graph.node] == [n.name for n in onnx.load(src).graph.node]
    assert "written as the original" in str(res.guard)


def test_guard_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _scripted(monkeypatch, [0.5])
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o.onnx", guard=False)
    assert calls == [] and res.guard is None and "skipped (--no-guard)" in res.summary()


def test_real_measurement_reports_both_models(tmp_path: Path) -> None:
    res = evonnx.optimize(_conv_model(tmp_path), tmp_path / "o.onnx", guard=True, guard_seconds=0.05)
    assert res.guard is not None and not res.guard.note
    final = res.guard.comparisons
    assert res.kernels == [] or final  # kernels kept were timed; with none left there is nothing to time
    for c in final:
        assert c.original["median_us"] > 0 and c.optimized["median_us"] > 0 and c.original["runs"] >= 10
        assert c.ratio == pytest.approx(c.original["median_us"] / c.optimized["median_us"])


def test_a_reduced_plan_that_fails_the_check_ends_with_the_original(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, [0.8])
    real = api.check_models
    checks: list[int] = []

    def flaky(*args: object, **kwargs: object) -> object:
        checks.append(1)
        if len(checks) == 2:  # the plan without the kernel feeding the Conv
            raise api.VerificationError("output 'y' differs")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "check_models", flaky)
    src = _conv_model(tmp_path)
    res = evonnx.optimize(src, tmp_path / "o.onnx", guard=True)
    assert len(checks) == 2 and res.kernels == []
    assert [n.name for n in onnx.load(tmp_path / "o.onnx").graph.node] == [n.name for n in onnx.load(src).graph.node]
    assert res.guard is not None and "failed the check" in str(res.guard)


def test_always_slower_leaves_nms_in_an_if_branch_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's last stage names every node of the main graph; an NMS inside an If branch, which evonnx's op
    runs, goes back to onnxruntime with them, so the model written is the original (and was checked as such)."""
    calls = _scripted(monkeypatch, [0.8])
    boxes = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, "N", 4])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, "N"])
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    m = helper.make_tensor("m", TensorProto.INT64, [1], [100])
    branch = helper.make_graph([helper.make_node("NonMaxSuppression", ["boxes", "scores", "m"], ["sel"],
                                                 name="inner_nms")],
                               "then", [], [helper.make_tensor_value_info("sel", TensorProto.INT64, ["K", 3])])
    other = helper.make_graph([helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["none"], name="empty")],
                              "else", [], [helper.make_tensor_value_info("none", TensorProto.INT64, ["K", 3])])
    graph = helper.make_graph([helper.make_node("If", ["flag"], ["out"], name="if", then_branch=branch,
                                                else_branch=other)], "g", [boxes, scores, flag],
                              [helper.make_tensor_value_info("out", TensorProto.INT64, ["K", 3])], [m])
    src = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), src)
    res = evonnx.optimize(src, tmp_path / "o.onnx", guard=True)
    written = onnx.load(tmp_path / "o.onnx")
    domains = {n.domain for a in written.graph.node[0].attribute for n in a.g.node}
    assert domains == {""} and res.nms == [] and "written as the original" in str(res.guard), (domains, res.guard)
    assert calls == [0]  # the one timed build had no Fused kernel, only the two NMS


@pytest.mark.parametrize("use_guard", [True, False])
def test_no_kernel_planned_writes_the_original_model(tmp_path: Path, use_guard: bool) -> None:
    # x[2, 2] -> Size -> Greater -> If: onnxruntime's basic optimizations (which evonnx plans on) fold the Size
    # and Greater of a static shape; with no kernel planned, nothing was gained that a folded graph would keep,
    # and the user gets the model as written, not onnxruntime's rewrite of it
    then_b = helper.make_graph([helper.make_node("Neg", ["x"], ["a"])], "t", [],
                               [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 2])])
    else_b = helper.make_graph([helper.make_node("Abs", ["x"], ["b"])], "e", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 2])])
    nodes = [helper.make_node("Size", ["x"], ["s"], name="size"),
             helper.make_node("Greater", ["s", "k"], ["c"], name="greater"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_b, else_branch=else_b)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
                              [numpy_helper.from_array(np.array(3, np.int64), "k")])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))
    res = evonnx.optimize(src, tmp_path / "o.onnx", guard=use_guard)
    assert res.kernels == []
    written = onnx.load(tmp_path / "o.onnx")
    assert [n.name for n in written.graph.node] == ["size", "greater", "if"]
    assert "3 nodes -> 3" in res.summary()
