"""float16 tensors in fused kernels (issue 12): stored as float16, converted to float32 where a kernel loads them,
every op computed in float32 and its float results rounded back to float16 (`expr.HALF`), as onnxruntime's CPU
kernels do. View ops move float16 bits unchanged; conversions round to nearest even, overflow to infinity and keep
NaN, -0 and subnormals; ops whose float16 kernels in onnxruntime compute otherwise stay with it or are compared
within float16's tolerance. Every op and special value is in the semantics table as well (float16 rows)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import evonnx
from evonnx.expr import is_exact
from evonnx.kernels.printing import helpers, template
from evonnx.passes import lazy as L
from evonnx.passes.analyze import analyze
from evonnx.passes.lazy import Reject
from evonnx.passes.lower_ops import lower_node

pytestmark = pytest.mark.compiler
RUNTIME = Path(__file__).resolve().parents[2] / "kernels" / "runtime"

# special float16 values: NaN, +-inf, +-0, the largest finite, the smallest subnormal, 1 and ties
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 65504.0, -65504.0, 6e-08, 1.0, -2.5, 0.333, 1000.0],
                   np.float16)


def _save(tmp_path: Path, nodes: list, inputs: list, outputs: list, inits: list) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _decode(tmp_path: Path) -> Path:
    """A YOLO-style decode in float16: the scores Transposed, Sigmoid, scaled by a float16 table and offset; a
    Slice/Concat of the result; a Cast of it to float; a ReduceMax over the raw values."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
             helper.make_node("Sigmoid", ["xt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["m"]),
             helper.make_node("Add", ["m", "xt"], ["a"]),
             helper.make_node("Cast", ["a"], ["as_float"], to=T.FLOAT),
             helper.make_node("Slice", ["xt", "st", "en", "ax"], ["sl"]),
             helper.make_node("Concat", ["sl", "sl"], ["moved"], axis=0),
             helper.make_node("ReduceMax", ["xt"], ["top"], axes=[1], keepdims=0)]
    inits = [numpy_helper.from_array(np.array([0.5, 2, 3.3, 7], np.float16).reshape(4, 1), "scale"),
             numpy_helper.from_array(np.array([1], np.int64), "st"),
             numpy_helper.from_array(np.array([3], np.int64), "en"),
             numpy_helper.from_array(np.array([0], np.int64), "ax")]
    return _save(tmp_path, nodes, [helper.make_tensor_value_info("x", T.FLOAT16, ["N", 4])],
                 [helper.make_tensor_value_info("a", T.FLOAT16, [4, "N"]),
                  helper.make_tensor_value_info("as_float", T.FLOAT, [4, "N"]),
                  helper.make_tensor_value_info("moved", T.FLOAT16, [4, "N"]),
                  helper.make_tensor_value_info("top", T.FLOAT16, [4])], inits)


def _same_bits(got: np.ndarray, ref: np.ndarray) -> bool:
    return got.dtype == ref.dtype and got.shape == ref.shape and bool(
        np.all((got.view(np.uint16) == ref.view(np.uint16)) | (np.isnan(got) & np.isnan(ref))))


def test_float16_decode_fuses_and_matches_onnxruntime(tmp_path: Path) -> None:
    src = _decode(tmp_path)
    dump = tmp_path / "dump"
    res = evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    assert res.kernels
    opt_model = onnx.load(tmp_path / "m.opt.onnx")
    assert {n.domain for n in opt_model.graph.node} == {"ai.evonnx"}, "every node fused, float16 included"
    source = (dump / "kernels.c").read_text()
    assert "const evo_half *restrict in0" in source and "evo_h2f(" in source and "evo_f2h(" in source
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    opt = evonnx.load_session(tmp_path / "m.opt.onnx")
    rng = np.random.default_rng(0)
    for n in (0, 1, 3, 37):
        x = np.resize(SPECIAL, n * 4).reshape(n, 4) if n % 2 else (rng.standard_normal((n, 4)) * 3).astype(np.float16)
        want = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, {"x": x})))
        got = dict(zip([o.name for o in opt.get_outputs()], opt.run(None, {"x": x})))
        for name in ("moved", "top"):  # moved and compared, never computed: the same bits
            assert _same_bits(got[name], want[name]), (n, name, got[name], want[name])
        for name in ("a", "as_float"):
            assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
            np.testing.assert_allclose(got[name].astype(np.float32), want[name].astype(np.float32), rtol=4e-3,
                                       atol=1e-3, equal_nan=True, err_msg=f"{name} at N={n}")


def test_float16_conversions_round_as_onnxruntime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 -> float16 at ties (to even), past the largest finite (to infinity) and into the subnormals; float16
    -> float32 exactly; int32 -> float16. Between Transposes, so that a kernel computes them; both CPU variants
    (the check runs each), bit for bit against onnxruntime."""
    nodes = [helper.make_node("Transpose", ["f"], ["ft"], perm=[1, 0]),
             helper.make_node("Cast", ["ft"], ["fh"], to=T.FLOAT16),
             helper.make_node("Transpose", ["fh"], ["half"], perm=[1, 0]),
             helper.make_node("Cast", ["fh"], ["back"], to=T.FLOAT),
             helper.make_node("Transpose", ["i"], ["it"], perm=[1, 0]),
             helper.make_node("Cast", ["it"], ["ih"], to=T.FLOAT16),
             helper.make_node("Transpose", ["ih"], ["from_int"], perm=[1, 0])]
    src = _save(tmp_path, nodes, [helper.make_tensor_value_info("f", T.FLOAT, ["N", 16]),
                                  helper.make_tensor_value_info("i", T.INT32, ["N", 16])],
                [helper.make_tensor_value_info("half", T.FLOAT16, ["N", 16]),
                 helper.make_tensor_value_info("back", T.FLOAT, [16, "N"]),
                 helper.make_tensor_value_info("from_int", T.FLOAT16, ["N", 16])], [])
    res = evonnx.optimize(src, tmp_path / "m.opt.onnx", guard=False)
    assert res.kernels
    f = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504, 65519.99, 65520, -65520, 2 ** -25, 2 ** -24 * 1.5,
                  2 ** -25 * 1.01, np.nan, -0.0, np.inf, -np.inf, 1e30, 3.14159, -1e-8], np.float32)
    i = np.array([0, 1, -1, 2049, 2051, 65504, 65519, 65520, 1 << 20, -(1 << 31), (1 << 31) - 1, 4097, 3, -7, 100,
                  -2049], np.int32)
    feeds = {"f": np.stack([f, f[::-1]]), "i": np.stack([i, i[::-1]])}
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    for isa in ("", "baseline"):  # as this machine picks (F16C where it has x86-64-v3), then without F16C
        monkeypatch.setenv("EVONNX_CPU_ISA", isa)  # read when the session creates each kernel
        opt = evonnx.load_session(tmp_path / "m.opt.onnx")
        for k, (got, want) in enumerate(zip(opt.run(None, feeds), ref)):
            if want.dtype == np.float16:
                assert _same_bits(got, want), (isa, k, got, want)
            else:
                np.testing.assert_array_equal(got, want)


def _lowered(op: str, attrs: dict, dtypes: list[str]) -> list[L.Lazy] | Reject:
    args = [L.source(k, dt, [4]) for k, dt in enumerate(dtypes)]
    try:
        return lower_node(op, attrs, args, [None] * len(args), 1)
    except Reject as r:
        return r


def test_float16_ops_onnxruntime_computes_otherwise() -> None:
    # computed in float16 by onnxruntime, so they overflow where a float32 kernel would not: left to it
    for op in ("Softplus", "ReduceLogSumExp"):
        assert isinstance(_lowered(op, {}, ["float16"]), Reject), op
    assert isinstance(_lowered("Cast", {"to": T.FLOAT16}, ["float64"]), Reject), "float32 in between rounds twice"
    # exact in float32, but onnxruntime's float16 kernel rounds otherwise: compared within tolerance
    hs = _lowered("HardSwish", {}, ["float16"])
    assert not isinstance(hs, Reject) and not is_exact(hs[0].at([1]))
    # a single IEEE operation in float32 then rounded is the correctly rounded float16 result: exact
    add = _lowered("Add", {}, ["float16", "float16"])
    assert not isinstance(add, Reject) and add[0].dtype == "float16" and is_exact(add[0].at([1]))
    # Sign of NaN is 0 in onnxruntime's float16 kernel (NaN in its float one)
    sign = _lowered("Sign", {}, ["float16"])
    assert not isinstance(sign, Reject) and "isnan" in str(sign[0].at([0]))
    # a view moves float16 unchanged: no conversion
    t = _lowered("Transpose", {"perm": [0]}, ["float16"])
    assert not isinstance(t, Reject) and t[0].dtype == "float16" and "cast" not in str(t[0].at([2]))


def test_float16_tensors_are_analysed() -> None:
    x = gs.Variable("x", dtype=np.float16, shape=["N", 4])
    y = gs.Variable("y", dtype=np.float16, shape=["N", 4])
    g = gs.Graph(nodes=[gs.Node("Neg", name="neg", inputs=[x], outputs=[y])], inputs=[x], outputs=[y], opset=17)
    an = analyze(g, 17)
    assert an.tensors["y"].dtype == "float16"
    assert isinstance(an.lowered["neg"], list)


def test_float16_conversions_are_exact_on_every_float16_and_many_floats(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels' own conversions (prelude.c: integer and float32 arithmetic, which gcc vectorises) against
    numpy's, in both CPU variants: every one of the 65536 float16 patterns to float32, and to float16 every
    float16's value, its float32 neighbours, the midpoints between float16s and theirs, and random patterns."""
    nodes = [helper.make_node("Transpose", ["h"], ["ht"], perm=[1, 0]),
             helper.make_node("Cast", ["ht"], ["hf"], to=T.FLOAT),
             helper.make_node("Transpose", ["hf"], ["widened"], perm=[1, 0]),
             helper.make_node("Transpose", ["f"], ["ft"], perm=[1, 0]),
             helper.make_node("Cast", ["ft"], ["fh"], to=T.FLOAT16),
             helper.make_node("Transpose", ["fh"], ["narrowed"], perm=[1, 0])]
    src = _save(tmp_path, nodes, [helper.make_tensor_value_info("h", T.FLOAT16, ["N", 256]),
                                  helper.make_tensor_value_info("f", T.FLOAT, ["M", 256])],
                [helper.make_tensor_value_info("widened", T.FLOAT, ["N", 256]),
                 helper.make_tensor_value_info("narrowed", T.FLOAT16, ["M", 256])], [])
    res = evonnx.optimize(src, tmp_path / "m.opt.onnx", guard=False)
    assert {op for k in res.kernels for op in k.source_ops} >= {"Cast", "Transpose"}
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    values = every.astype(np.float32)
    finite = values[np.isfinite(values)]
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    rng = np.random.default_rng(5)
    floats = np.concatenate([values, np.nextafter(finite, np.inf), np.nextafter(finite, -np.inf), mids,
                             np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                             rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    floats = np.resize(floats, (-(-floats.size // 256), 256)).astype(np.float32)
    with np.errstate(all="ignore"):
        want_h = floats.astype(np.float16)
    feeds = {"h": every.reshape(-1, 256), "f": floats}
    for isa in ("", "baseline"):
        monkeypatch.setenv("EVONNX_CPU_ISA", isa)
        widened, narrowed = evonnx.load_session(tmp_path / "m.opt.onnx").run(None, feeds)
        same = (widened.view(np.uint32) == values.reshape(-1, 256).view(np.uint32)) | (
            np.isnan(widened) & np.isnan(values.reshape(-1, 256)))
        assert same.all(), (isa, every.reshape(-1, 256)[~same][:4])
        assert _same_bits(narrowed, want_h), (isa, floats[~((narrowed.view(np.uint16) == want_h.view(np.uint16))
                                                         | (np.isnan(narrowed) & np.isnan(want_h)))][:4])


@pytest.mark.parametrize("arch", ["x86-64", "x86-64-v3"])
def test_round_h_is_the_conversions_round_trip_on_every_float32(tmp_path: Path, arch: str) -> None:
    """evo_round_h(x), which a float16 operation's result goes through, against evo_h2f(evo_f2h(x)), bit for bit on
    all 2^32 float32 patterns, compiled as the kernels are (both variants' instruction sets)."""
    prelude = template("prelude.c").substitute(model="round_h", helpers=helpers(), half="#define EVO_HALF 1")
    src = tmp_path / "round_h.c"
    src.write_text(prelude + """
#define EVO_N 4096
int main(void) {
    static float in[EVO_N];
    static uint32_t a[EVO_N], b[EVO_N];
    unsigned long long bad = 0;
    uint32_t first = 0;
    for (uint64_t base = 0; base < (UINT64_C(1) << 32); base += EVO_N) {
        for (int i = 0; i < EVO_N; ++i) in[i] = evo_bits_f32((uint32_t)(base + i));
        for (int i = 0; i < EVO_N; ++i) a[i] = evo_f32_bits(evo_h2f(evo_f2h(in[i])));
        for (int i = 0; i < EVO_N; ++i) b[i] = evo_f32_bits(evo_round_h(in[i]));
        for (int i = 0; i < EVO_N; ++i)
            if (a[i] != b[i]) { if (!bad) first = (uint32_t)(base + i); ++bad; }
    }
    printf("%llu %08x\\n", bad, first);
    return 0;
}
""")
    exe = tmp_path / "round_h"
    flags = ["-std=gnu11", "-O3", f"-march={arch}", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
             "-fopenmp-simd", "-Wno-unused-function"]
    build = subprocess.run(["gcc", *flags, f"-I{RUNTIME}", str(src), "-o", str(exe), "-lm"], capture_output=True,
                           text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    bad, first = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert bad == "0", f"{bad} float32 patterns round otherwise, the first {first}"
