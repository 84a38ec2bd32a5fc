"""Reductions a kernel computes once (kernels/share.py): two consumers of one ReduceMax, a ReduceMax and an ArgMax
of the same values (torch's `max(dim)`), a YOLO score filter testing the max and storing it. The result must stay
onnxruntime's exactly: ties (first or last index), NaN at element 0 and after it, -0 against +0, infinities,
integers, and a row of one element."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import evonnx
from evonnx.expr import Load, Op, Reduce, binary
from evonnx.index import Poly, var
from evonnx.kernels.share import Canon, argmax_from_max

K = 80


def _max_of(v: Poly, base: int = 0) -> Reduce:
    return Reduce("max", v, binary("mul", Load(0, v + base, "float32"), Load(1, Poly.of(0), "float32")), "float32")


def test_canon_makes_reductions_equal_but_for_their_variable_one() -> None:
    a, b, c = var("_r1", K), var("_r2", K), var("_r3", K - 1)
    canon = Canon()
    assert _max_of(a) != _max_of(b)
    assert canon(_max_of(a)) == canon(_max_of(b))
    assert canon(_max_of(a)) != canon(_max_of(c))  # another extent
    assert canon(_max_of(a)) != canon(_max_of(b, base=1))  # other values
    assert canon(Reduce("min", a, _max_of(b).body, "float32")) != canon(_max_of(a))  # another operation
    # nested: the sum over rows of each row's max, written with other names, is one expression too
    row, col = var("_r4", 3), var("_r5", K)
    inner = Reduce("max", col, Load(0, row * K + col, "float32"), "float32")
    row2, col2 = var("_r6", 3), var("_r7", K)
    inner2 = Reduce("max", col2, Load(0, row2 * K + col2, "float32"), "float32")
    assert canon(Reduce("sum", row, inner, "float32")) == canon(Reduce("sum", row2, inner2, "float32"))


def test_a_top_level_argmax_searches_for_the_shared_max() -> None:
    canon = Canon()
    a, b = var("_r1", K), var("_r2", K)
    arg = Reduce("argmax", a, _max_of(a).body, "int64", 1)
    roots = [canon(_max_of(b)), canon(arg)]
    new = argmax_from_max(roots, canon)
    assert new[0] == roots[0]
    search = new[1]
    assert isinstance(search, Reduce) and search.op == "last"
    assert isinstance(search.body, Op) and search.body.op == "eq" and search.body.args[1] == roots[0]
    # under a guarded branch (its reads must not run unless taken) the ArgMax is left as it is
    guarded = Op("where", (Load(2, Poly.of(0), "bool"), canon(arg), Load(3, Poly.of(0), "int64")), "int64", "guard")
    assert argmax_from_max([guarded], canon) == [guarded]


def _model(path: Path, dtype: int, last: int, k: int = K) -> Path:
    """x[N, K] -> Mul by a column of x: ReduceMax, a second ReduceMax read by a Greater, ArgMax (a score filter's
    shape), all fused into one kernel."""
    col = helper.make_node("Slice", ["x", "s0", "s1", "ax"], ["c"])
    nodes = [col, helper.make_node("Mul", ["x", "c"], ["p"]),
             helper.make_node("ReduceMax", ["p", "ax"], ["m1"], keepdims=1),
             helper.make_node("ReduceMax", ["p", "ax"], ["m2"], keepdims=1),
             helper.make_node("Greater", ["m2", "zero"], ["keep"]),
             helper.make_node("ArgMax", ["p"], ["i"], axis=1, keepdims=1, select_last_index=last),
             helper.make_node("Cast", ["i"], ["ic"], to=dtype),
             helper.make_node("Cast", ["keep"], ["kc"], to=dtype),
             helper.make_node("Concat", ["m1", "ic", "kc"], ["y"], axis=1)]
    np_t = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("s0", [0]), ("s1", [1]), ("ax", [1]))]
    inits.append(onnx.numpy_helper.from_array(np.zeros((1, 1), np_t), "zero"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", dtype, ["N", k])],
                              [helper.make_tensor_value_info("y", dtype, ["N", 3])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(path))
    return path


def _rows(n: int, dtype: int, rng: np.random.Generator, k: int = K) -> np.ndarray:
    if dtype == TensorProto.INT32:
        x = rng.integers(-3, 4, size=(n, k)).astype(np.int32)
        x[:, 0] = rng.choice([1, -1], size=n)
        return x
    x = np.round(rng.standard_normal((n, k)) * 2, 0).astype(np.float32)  # many ties
    x[:, 0] = rng.choice([1.0, -1.0, 0.5], size=n)
    for r in range(n):
        kind = r % 7
        if kind == 1:
            x[r, 1] = np.nan  # NaN at element 0 of the product (x * x[:, 0])
            x[r, 0] = np.nan
        elif kind == 2:
            x[r, rng.integers(2, max(3, k), size=3) % k] = np.nan  # NaN after element 0 (and 1)
        elif kind == 3:
            x[r, 1:] = 0.0
            x[r, 1::2] = -0.0  # -0 and +0 tie
        elif kind == 4:
            x[r, rng.integers(1, k, size=2)] = np.inf
        elif kind == 5:
            x[r, 1:] = -np.inf
    return x


@pytest.mark.compiler
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.INT32])
@pytest.mark.parametrize("last", [0, 1])
def test_shared_max_and_argmax_match_onnxruntime(tmp_path: Path, dtype: int, last: int) -> None:
    src = _model(tmp_path / "m.onnx", dtype, last)
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False, planner="greedy")
    code = (dump / "kernels.c").read_text()
    assert len(re.findall(r"omp simd reduction\(max:r\d+_acc", code)) == 1, "the three reductions read the row once"
    search = "max" if last else "min"  # the last (first) position holding the max, vectorised
    assert re.search(rf"omp simd reduction\({search}:r\d+_at\)", code), "the ArgMax searches for the max"
    _matches_onnxruntime(src, tmp_path / "m.opt.onnx", dtype, np.random.default_rng(last), (0, 1, 7, 64), K)


def _matches_onnxruntime(src: Path, opt_path: Path, dtype: int, rng: np.random.Generator, sizes: tuple[int, ...],
                         k: int) -> None:
    """`_model`'s optimized model against onnxruntime on `_rows` of each size: the ArgMax on every row."""
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    opt = evonnx.load_session(opt_path)
    for n in sizes:
        x = _rows(n, dtype, rng, k)
        (want,) = ref.run(None, {"x": x})
        (got,) = opt.run(None, {"x": x})
        np.testing.assert_array_equal(got[:, 1], want[:, 1], err_msg=f"ArgMax, N={n}")
        # onnxruntime's ReduceMax over an innermost axis lets a NaN after element 0 win or not by its SIMD lane
        # (README, Limits); its ArgMax is a scalar loop, compared on every row above
        steady = np.arange(n) % 7 != 2 if dtype == TensorProto.FLOAT else np.ones(n, bool)
        np.testing.assert_array_equal(got[steady], want[steady], err_msg=f"N={n}")


@pytest.mark.compiler
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.INT32])
@pytest.mark.parametrize("k", [2, 9, 13, 31])
def test_max_and_first_index_in_one_pass_over_any_row_length(tmp_path: Path, dtype: int, k: int) -> None:
    """The ReduceMax and its ArgMax in one pass (share.extreme_and_first: 8 lanes, then the remainder of a row
    that is not a multiple of 8 in the lanes it falls on): the same values and indices as onnxruntime's, rows of
    ties, NaN, infinities and all -inf (its index found by the scan) among them."""
    src = _model(tmp_path / "m.onnx", dtype, 0, k)
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False, planner="greedy")
    code = (dump / "kernels.c").read_text()
    assert re.search(r"r\d+_m\[8\];", code), "the max and its index in one pass"
    _matches_onnxruntime(src, tmp_path / "m.opt.onnx", dtype, np.random.default_rng(k), (1, 7, 50), k)


@pytest.mark.compiler
@pytest.mark.parametrize("k", [2, 3, 5])
def test_a_small_stack_reduced_at_once_is_unrolled(tmp_path: Path, k: int) -> None:
    """Unsqueeze, Concat on a new last axis, ReduceSum over it (effdet's BiFPN combining 2 or 3 weighted inputs):
    a sum of at most SMALL_REDUCTION terms is its chain from 0 (share._unrolled), each term reading one input at
    its own position, with no loop and no select; 5 terms keep the loop. Against onnxruntime, special values
    included."""
    from evonnx.kernels.share import SMALL_REDUCTION

    names = [f"x{i}" for i in range(k)]
    nodes = [helper.make_node("Unsqueeze", [n, "ax"], [f"u{i}"]) for i, n in enumerate(names)]
    nodes += [helper.make_node("Concat", [f"u{i}" for i in range(k)], ["c"], axis=-1),
              helper.make_node("ReduceSum", ["c", "ax"], ["s"], keepdims=0),
              helper.make_node("Sigmoid", ["s"], ["g"]), helper.make_node("Mul", ["s", "g"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 64])
                                           for n in names],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
                              [onnx.numpy_helper.from_array(np.array([-1], np.int64), "ax")])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(src))
    dump = tmp_path / "dump"
    res = evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False, planner="greedy")
    assert len(res.kernels) == 1
    code = (dump / "kernels.c").read_text()
    tasks = code[code.index("EVO_TASK(", code.index("kernel evo")):]
    assert ("reduction(+:" in tasks) == (k > SMALL_REDUCTION) and ("volatile" in tasks) == (k > SMALL_REDUCTION)
    rng = np.random.default_rng(k)
    feeds = {n: (rng.standard_normal((9, 64)) * 50).astype(np.float32) for n in names}
    feeds["x0"][0, :4] = [np.inf, -np.inf, np.nan, -0.0]
    feeds[names[-1]][1, :3] = [-np.inf, np.inf, 0.0]
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = evonnx.load_session(tmp_path / "m.opt.onnx").run(None, feeds)
    # the chain adds in onnxruntime's order; the loop of 5 is vectorised in another (a sum, checked with a tolerance)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=0 if k <= SMALL_REDUCTION else 1e-4)
