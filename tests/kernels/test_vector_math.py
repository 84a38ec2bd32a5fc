"""Vectorisable math in the CPU kernels (issue 12): functions of our own, with no libm call in a hot loop, so gcc
vectorises the loops around them. Each one's stated maximum error is checked over dense samples of every binade
against float64 numpy, and its special values against onnxruntime's CPU kernel.

- evo_logf (prelude.c): Cephes' degree-8 polynomial on the mantissa reduced to [sqrt(1/2), sqrt(2)), subnormals
  scaled into range first. At most 1 ulp from the correctly rounded logarithm; onnxruntime's Log (Eigen's) is at
  most 2. An exhaustive run over every positive float32 (a C loop, 2^31 values) found 1 ulp at most, 99.4% exact.
- evo_softplus_f32 (helpers.h): log1p(exp(-|x|)) through evo_expf and evo_logf (Goldberg's log1p), plus max(x, 0).
  At most 2 ulp from float64 over every 509th float with |x| < 200 (93.5% exact); onnxruntime's Softplus is at
  most 4.
- evo_expf_bounded (prelude.c): evo_expf of an argument at most 88 or NaN (a Softmax's x - max(x), a Clip's result),
  without the overflow clamp and with 2^n in one step. The same bits as evo_expf from 88 down to -87.34 (where exp
  reaches the subnormals), all within 1 ulp of the correctly rounded exp (every float32 in that range, a C loop);
  below, at most 8.6e-39 off.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import evonnx
from evonnx.kernels.printing import helpers, template

pytestmark = pytest.mark.compiler


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units of the last place between float32 arrays of finite values of one sign."""
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def _optimized(tmp_path: Path, nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray] | None = None,
               opset: int = 17) -> tuple[ort.InferenceSession, ort.InferenceSession, str]:
    """x[N] -> nodes -> y[N], float32, optimized (no guard): onnxruntime's session on the original, evonnx's on the
    optimized model, and the C of its kernels' tasks."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), str(src))
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    code = (dump / "kernels.c").read_text()
    tasks = code[code.index("EVO_TASK(", code.index("kernel evo")):]
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    return ref, evonnx.load_session(tmp_path / "m.opt.onnx"), tasks


def _chain(tmp_path: Path, op: str, fn: str = "") -> tuple[ort.InferenceSession, ort.InferenceSession]:
    """op(x) * 1: two nodes, so that one kernel computes them (the product by one is exact)."""
    nodes = [helper.make_node(op, ["x"], ["t"]), helper.make_node("Mul", ["t", "one"], ["y"])]
    ref, opt, tasks = _optimized(tmp_path, nodes, {"one": np.array(1, np.float32)})
    assert f"{fn or f'evo_{op.lower()}f'}(" in tasks and f" {op.lower()}f(" not in tasks  # ours, not libm's
    return ref, opt


def test_log_within_one_ulp_of_float64_and_onnxruntime_special_values(tmp_path: Path) -> None:
    ref, opt = _chain(tmp_path, "Log")
    # every 509th positive float (about 4.2 M values over every binade, subnormals included), and 1 +- a few ulp
    bits = np.arange(1, 0x7F800000, 509, dtype=np.uint32)
    near_one = np.float32(1) + np.arange(-64, 64, dtype=np.float32) * np.float32(2 ** -23)
    x = np.concatenate([bits.view(np.float32), near_one])
    (got,) = opt.run(None, {"x": x})
    want = np.log(x.astype(np.float64)).astype(np.float32)
    pos, neg = want >= 0, want < 0  # ulp distances within one sign
    assert _ulps(got[pos], want[pos]).max() <= 1 and _ulps(-got[neg], -want[neg]).max() <= 1
    (theirs,) = ref.run(None, {"x": x})
    assert _ulps(got[pos], theirs[pos]).max() <= 3 and _ulps(-got[neg], -theirs[neg]).max() <= 3
    special = np.array([0.0, -0.0, -1e-45, -1.0, -np.inf, np.inf, np.nan, 1.0, 1e-45, 1.1754942e-38,
                        1.1754944e-38, 3.4028235e38], np.float32)
    (got,), (theirs,) = opt.run(None, {"x": special}), ref.run(None, {"x": special})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(theirs))
    finite = ~np.isnan(got)
    assert np.array_equal(np.isinf(got), np.isinf(theirs)) and (got[got == 0] == 0).all()
    assert _ulps(np.abs(got[finite]), np.abs(theirs[finite])).max() <= 3
    assert np.array_equal(np.sign(got[finite]), np.sign(theirs[finite]))


def test_softplus_within_two_ulp_of_float64_and_onnxruntime_special_values(tmp_path: Path) -> None:
    ref, opt = _chain(tmp_path, "Softplus", "evo_softplus_f32")
    bits = np.arange(0, 0x7F800000, 509, dtype=np.uint32)
    x = np.concatenate([bits.view(np.float32), -bits.view(np.float32)])
    x = x[np.abs(x) < 200]  # beyond, the result is x or 0 (exact, or below the smallest subnormal)
    (got,) = opt.run(None, {"x": x})
    x64 = x.astype(np.float64)
    want = np.where(x64 > 0, x64 + np.log1p(np.exp(-x64)), np.log1p(np.exp(x64))).astype(np.float32)
    assert (got >= 0).all() and _ulps(got, want).max() <= 2
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 88.0, 89.0, -88.0, -104.0, -150.0, 1e-40, -1e-40, 20.0,
                        -20.0, 3e38, -3e38], np.float32)
    (got,), (theirs,) = opt.run(None, {"x": special}), ref.run(None, {"x": special})
    np.testing.assert_array_equal(got, theirs)


def test_mish_is_one_op_within_four_ulp_of_float64_and_onnxruntime_special_values(tmp_path: Path) -> None:
    """Softplus -> Tanh -> Mul(x, .) becomes evo_mish_f32 (one exp, one division): at most 4 ulp from float64 over
    every 509th float with |x| < 200 and above the subnormal results, and the three ops' special values."""
    nodes = [helper.make_node("Softplus", ["x"], ["s"]), helper.make_node("Tanh", ["s"], ["t"]),
             helper.make_node("Mul", ["t", "x"], ["y"])]
    ref, opt, tasks = _optimized(tmp_path, nodes)
    assert "evo_mish_f32(" in tasks and "evo_softplus_f32(" not in tasks and "evo_tanh_f32(" not in tasks
    bits = np.arange(0, 0x7F800000, 509, dtype=np.uint32)
    v = np.concatenate([bits.view(np.float32), -bits.view(np.float32)])
    v = v[np.abs(v) < 200]
    (got,), (theirs,) = opt.run(None, {"x": v}), ref.run(None, {"x": v})
    v64 = v.astype(np.float64)
    want = (v64 * np.tanh(np.logaddexp(0.0, v64))).astype(np.float32)
    # where exp(x) times the tanh's constant term is a normal float, and so is the result; elsewhere both follow
    # onnxruntime's tanh of a tiny softplus, its subnormal intermediates included (helpers.h)
    normal = (v > -80) & (np.abs(want) >= 1e-30)
    pos, neg = normal & (want > 0), normal & (want < 0)
    assert _ulps(got[pos], want[pos]).max() <= 4 and _ulps(-got[neg], -want[neg]).max() <= 4
    assert (got[want == 0] == 0).all()
    np.testing.assert_allclose(got[~normal], theirs[~normal], rtol=1e-5, atol=3e-45)  # an exp 1 ulp apart, scaled
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 9.0, 20.0, 21.0, 44.0, 89.0, -88.0, -104.0, -150.0,
                        3e38, -3e38, 1e-40, -1e-40], np.float32)
    (got,), (theirs,) = opt.run(None, {"x": special}), ref.run(None, {"x": special})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(theirs))
    np.testing.assert_allclose(got, theirs, rtol=4e-7, atol=1e-44)


@pytest.mark.parametrize("threshold", [20.0, 1.0])
def test_torchs_thresholded_softplus_under_a_tanh_is_mish_where_the_threshold_is_past_tanhs_clamp(
        tmp_path: Path, threshold: float) -> None:
    """The dynamo exporter writes F.softplus as Where(x > 20, x, Softplus(x)); under a Tanh, above 9 that is
    onnxruntime's tanh(9) either way, so Mul(x, Tanh(.)) is Mish. With a threshold of 1 it is another function."""
    nodes = [helper.make_node("Softplus", ["x"], ["s"]), helper.make_node("Greater", ["x", "c"], ["g"]),
             helper.make_node("Where", ["g", "x", "s"], ["w"]), helper.make_node("Tanh", ["w"], ["t"]),
             helper.make_node("Mul", ["x", "t"], ["y"])]
    ref, opt, tasks = _optimized(tmp_path, nodes, {"c": np.array(threshold, np.float32)}, opset=18)
    assert ("evo_mish_f32(" in tasks) == (threshold >= 9)
    v = np.concatenate([np.linspace(-30, 30, 6001, dtype=np.float32),
                        np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 3e38, -3e38], np.float32)])
    (got,), (theirs,) = opt.run(None, {"x": v}), ref.run(None, {"x": v})
    np.testing.assert_allclose(got, theirs, rtol=1e-6, atol=1e-38)


def test_element_helpers_are_inlined_whatever_gccs_inlining_budget(tmp_path: Path) -> None:
    """The helpers a kernel calls per element are always inlined (prelude.c, EVO_FN): gcc drops a plain `static
    inline` once a large kernels.c exceeds its inlining budget, and a call per element kept YOLOv4's Mish loops
    scalar, 6x slower than the same kernel built alone. A budget of zero stands in for a large file here: no copy
    of a helper may be left in the library."""
    import shutil
    import subprocess

    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])
    nodes = [helper.make_node("Softplus", ["x"], ["s"]), helper.make_node("Tanh", ["s"], ["t"]),
             helper.make_node("Mul", ["x", "t"], ["m"]), helper.make_node("Erf", ["m"], ["e"]),
             helper.make_node("Log", ["e"], ["y"])]
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), str(src))
    budget = ("--param=inline-unit-growth=0", "--param=max-inline-insns-single=0", "--param=max-inline-insns-auto=0",
              "--param=early-inlining-insns=0")
    res = evonnx.optimize(src, tmp_path / "m.opt.onnx", guard=False, cflags=budget)
    assert len(res.kernels) == 1
    symbols = subprocess.run(["nm", str(res.library)], capture_output=True, text=True, check=True).stdout
    left = sorted({s for s in symbols.split() if s.startswith(("evo_softplus", "evo_tanh", "evo_erf", "evo_expf",
                                                               "evo_logf", "evo_mish"))})
    assert not left, f"not inlined: {left}"


_EXP_NONPOS = r"""
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
#define EVO_N 4096
int main(void) {
    static float in[EVO_N], a[EVO_N], b[EVO_N];
    unsigned long long differ = 0, worst = 0, tail = 0, nan = 0;
    uint32_t first = 0;
    /* every STRIDE-th pattern up to 88 and from -0 (0x80000000) to -inf (0xff800000), NaNs included, then -inf */
    for (uint64_t base = 0; base < 0x100000000u; base += (uint64_t)EVO_N * STRIDE) {
        for (int i = 0; i < EVO_N; ++i) {
            uint64_t u = base + (uint64_t)i * STRIDE;
            in[i] = from_bits(u < 0x100000000u ? (uint32_t)u : 0xff800000u);
        }
        for (int i = 0; i < EVO_N; ++i) a[i] = evo_expf_bounded(in[i]);
        for (int i = 0; i < EVO_N; ++i) b[i] = evo_expf(in[i]);
        for (int i = 0; i < EVO_N; ++i) {
            const float x = in[i];
            if (x != x) { nan += a[i] == a[i]; continue; }
            if (x > 88.0f) continue;
            if (x >= -87.33654f) {
                if (to_bits(a[i]) != to_bits(b[i])) { if (!differ) first = to_bits(x); ++differ; }
                const long long d = (long long)to_bits(a[i]) - (long long)to_bits((float)exp((double)x));
                const unsigned long long u = (unsigned long long)(d < 0 ? -d : d);
                worst = u > worst ? u : worst;
            } else {
                tail += !(a[i] >= 0.0f && fabs((double)a[i] - exp((double)x)) <= 8.6e-39);
            }
        }
    }
    printf("%llu %08x %llu %llu %llu\n", differ, first, worst, tail, nan);
    return 0;
}
"""


@pytest.mark.parametrize("arch", ["x86-64", "x86-64-v3"])
def test_exp_of_a_bounded_argument_is_evo_expf_down_to_the_subnormals(tmp_path: Path, arch: str) -> None:
    """evo_expf_bounded, the exp of an argument at most 88 (a Softmax's x - max(x), a Clip's result), on every
    97th float32 up to 88 and -inf, compiled as the kernels are (both variants' instruction sets): the bits of
    evo_expf where exp is normal (2^n applied in one step is exact there), within 1 ulp of the correctly rounded
    exp, 0 to 8.6e-39 below, and NaN for NaN."""
    import subprocess

    src = tmp_path / "exp_nonpos.c"
    src.write_text(template("prelude.c").substitute(model="exp_nonpos", helpers=helpers(), half="")
                   + "#define STRIDE 97\n" + _EXP_NONPOS)
    exe = tmp_path / "exp_nonpos"
    flags = ["-std=gnu11", "-O3", f"-march={arch}", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
             "-fopenmp-simd", "-Wno-unused-function"]
    runtime = Path(__file__).resolve().parents[2] / "kernels" / "runtime"
    build = subprocess.run(["gcc", *flags, f"-I{runtime}", str(src), "-o", str(exe), "-lm"], capture_output=True,
                           text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    differ, first, worst, tail, nan = subprocess.run([str(exe)], check=True, capture_output=True,
                                                     text=True).stdout.split()
    assert differ == "0", f"{differ} values differ from evo_expf, the first 0x{first}"
    assert int(worst) <= 1, f"{worst} ulp from exp"
    assert tail == "0", f"{tail} values below -87.34 are more than 8.6e-39 from exp"
    assert nan == "0", f"{nan} NaNs lost"


def test_softmax_exps_are_of_nonpositive_arguments(tmp_path: Path) -> None:
    """A Softmax's and LogSoftmax's exps (lower_reduce._softmax) call evo_expf_bounded; special values in a row
    (+-inf, NaN, a spread past exp's range) match onnxruntime."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 8])
    nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Softmax", ["n"], ["s"], axis=-1),
             helper.make_node("Neg", ["s"], ["y"]), helper.make_node("LogSoftmax", ["n"], ["l"], axis=-1),
             helper.make_node("Neg", ["l"], ["z"])]
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y, z]),
                                opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    code = (dump / "kernels.c").read_text()
    tasks = code[code.index("EVO_TASK(", code.index("kernel evo")):]
    assert "evo_expf_bounded(" in tasks and "evo_expf(" not in tasks
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(8) * 30, np.linspace(-200, 0, 8), [np.inf, 0, 1, 2, 3, 4, 5, 6],
            [-np.inf, 0, 1, 2, 3, 4, 5, 6], [np.nan, 0, 1, 2, 3, 4, 5, 6], [0, 1, np.nan, 3, 4, 5, 6, 7],
            [-np.inf] * 8, [np.inf, np.inf, 0, 0, 0, 0, 0, 0], [0, -90, -100, -87.5, -88, -103, 1e-30, 3]]
    feeds = {"x": np.array(rows, np.float32)}
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = evonnx.load_session(tmp_path / "m.opt.onnx").run(None, feeds)
    for want, have in zip(ref, got):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)
        assert np.array_equal(have == 0, want == 0)  # -inf logits give 0, and nothing else does


@pytest.mark.parametrize(("high", "bounded"), [(4.135166556742356, True), (88.0, True), (100.0, False)])
def test_an_exp_under_a_clip_to_at_most_88_takes_the_bounded_exp(tmp_path: Path, high: float, bounded: bool) -> None:
    """exp(Clip(x, lo, high)), a box decoder's clamped width (mmdet's delta2bbox: max_ratio), calls
    evo_expf_bounded where `high` is at most 88, so that it cannot overflow, and evo_expf otherwise; both match
    onnxruntime over special values and past exp's range."""
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]), helper.make_node("Exp", ["c"], ["y"])]
    ref, opt, tasks = _optimized(tmp_path, nodes, {"lo": np.array(-200, np.float32), "hi": np.array(high, np.float32)})
    assert ("evo_expf_bounded(" in tasks) == bounded and ("evo_expf(" in tasks) != bounded
    x = np.concatenate([np.linspace(-120, 120, 4001), [np.inf, -np.inf, np.nan, 0.0, -0.0, 88.5, 89.0, -87.5, -88.5,
                                                      -103.0, -104.5]]).astype(np.float32)
    (want,) = ref.run(None, {"x": x})
    (got,) = opt.run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-37)
