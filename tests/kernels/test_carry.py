"""Carried divisions (kernels/carry.py): a floor division or modulo by a run-time size, of an index that grows by 0
or 1 per iteration of a task's inner loop, runs as a running quotient and remainder. The results must be
onnxruntime's at every size, divisors of 0 and negative numerators included, on both CPU variants."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import evonnx
from evonnx.expr import IndexVal
from evonnx.index import Atom, FloorDiv, Mod, Poly, pmax, pmin, sym, var
from evonnx.kernels.carry import Carries, render
from evonnx.kernels.cprint import Names, print_poly
from evonnx.kernels.printing import helpers, template

pytestmark = pytest.mark.compiler

MODELS = Path(__file__).resolve().parents[2] / "models"
RUNTIME = Path(__file__).resolve().parents[2] / "kernels" / "runtime"


def _i64(name: str, values: list[int]) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(values, np.int64), name)


def _grid(tmp_path: Path) -> Path:
    """A per-cell value a[W, H], transposed to [H, W], repeated for 3 anchors per cell and flattened, then broadcast
    against N flags (mmdet's valid flags, in a form of its own): element j reads a at row fdiv(q, W) and column
    fmod(q, W) of the transposed view, q = fdiv(min(j, 3*H*W - 1), 3), two divisions by a run-time size."""
    nodes = [
        helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0]),
        helper.make_node("Unsqueeze", ["t", "two"], ["u"]),
        helper.make_node("Expand", ["u", "rep"], ["e"]),
        helper.make_node("Reshape", ["e", "flat"], ["r"]),
        helper.make_node("Cast", ["flags"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["r", "f"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "grid",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["W", "H"]),
         helper.make_tensor_value_info("flags", TensorProto.BOOL, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M"])],
        [_i64("two", [2]), _i64("rep", [1, 1, 3]), _i64("flat", [-1])])
    path = tmp_path / "grid.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_carries_find_the_chains_of_an_anchor_grid() -> None:
    j = var("j", sym("N"))
    jv = j.atom()
    h, w = sym("H"), sym("W")
    m = pmin(j, h * w * 3 - 1)
    cell = Poly.of(FloorDiv(m, Poly.of(3)))
    row = Mod(Poly.of(FloorDiv(cell, w)), h)
    carries = Carries(jv, set())  # type: ignore[arg-type]
    assert carries.find([IndexVal(Poly.of(row))], [])
    assert [(str(p.num), str(p.den)) for p in carries.pairs.values()] == [
        (str(m), "3"), (str(cell), "W"), (str(Poly.of(FloorDiv(cell, w))), "H")]
    # 2*j does not step by 0 or 1, and a divisor that moves with j is not fixed: neither is carried
    other = Carries(jv, set())  # type: ignore[arg-type]
    assert not other.find([IndexVal(Poly.of(Mod(j * 2, w))), IndexVal(Poly.of(Mod(w, j + 1)))], [])
    assert not other.pairs
    # constant divisors only: gcc's own division by a constant is as good, nothing is worth carrying
    assert not Carries(jv, set()).find([IndexVal(Poly.of(Mod(j + 5, Poly.of(4))))], [])  # type: ignore[arg-type]


def _c_cases() -> list[tuple[Carries, Names, list[Atom]]]:
    """Chains of carried atoms over j from j0: numerators below 0, min and max clamps, nested quotients."""
    j, w, k, h = var("j", sym("N")), sym("W"), sym("K"), sym("H")
    cases: list[list[Atom]] = []
    for c in (-7, 0, 5):
        q = Poly.of(FloorDiv(pmin(j + c, k), Poly.of(3)))
        cases.append([Mod(j + c, w), FloorDiv(j + c, w)])
        cases.append([Mod(q, w), Mod(Poly.of(FloorDiv(q, w)), h), FloorDiv(Poly.of(FloorDiv(q, w)), h)])
        cases.append([FloorDiv(pmax(j + c, k), w), Mod(pmax(j + c, k), w)])
    out = []
    for atoms in cases:
        names = Names({j.atom(): "j"}, {w.atom(): "s0", k.atom(): "s1", h.atom(): "s2"}, {})  # type: ignore[dict-item]
        carries = Carries(j.atom(), set())  # type: ignore[arg-type]
        assert carries.find([IndexVal(Poly.of(a)) for a in atoms], [])
        out.append((carries, names, atoms))
    return out


def test_carried_values_equal_the_divisions_they_replace(tmp_path: Path) -> None:
    """The loop carry.render prints, compiled with the kernels' prelude, against evo_fdiv and evo_fmod of the same
    numerators, for run-time divisors from 1 (and 0 and -2, where the carried loop must not run), clamps on either
    side of the numerator's range, and start positions j0 inside a row; -Wall -Wextra -Werror."""
    funcs = []
    for n, (carries, names, atoms) in enumerate(_c_cases()):
        direct = [print_poly(Poly.of(a), names) for a in atoms]

        def body(atoms: list[Atom] = atoms, names: Names = names, direct: list[str] = direct) -> str:
            carried = [print_poly(Poly.of(a), names) for a in atoms]
            diffs = [f"(({c}) != ({d}))" for c, d in zip(carried, direct, strict=True)]
            return "            bad += " + " + ".join(diffs) + ";"
        loop = render(carries, names, body, "            plain = 1;")
        funcs.append("\n".join([
            f"static long case{n}(int64_t s0, int64_t s1, int64_t s2, int64_t j0, int64_t stop) {{",
            "    long bad = 0;", "    int plain = 0;", "    (void)s1; (void)s2;", "    {", loop, "    }",
            "    return plain ? -1 : bad;", "}"]))
    calls = "\n".join(f"        r = case{n}(s0, s1, s2, j0, j0 + 60); if (r > 0) bad += r; else if (r < 0) ++plain;"
                      for n in range(len(funcs)))
    main = f"""int main(void) {{
    long bad = 0, plain = 0, r;
    for (int64_t s0 = -2; s0 <= 7; ++s0)
    for (int64_t s1 = -9; s1 <= 30; s1 += 3)
    for (int64_t s2 = 1; s2 <= 4; ++s2)
    for (int64_t j0 = 0; j0 <= 8; ++j0) {{
{calls}
    }}
    printf("%ld %ld\\n", bad, plain);
    return 0;
}}"""
    prelude = template("prelude.c").substitute(model="carry", helpers=helpers(), half="")
    src = tmp_path / "carry.c"
    src.write_text(prelude + "\n" + "\n".join(funcs) + "\n" + main + "\n")
    exe = tmp_path / "carry"
    build = subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror",
                            "-Wno-unused-function", f"-I{RUNTIME}", str(src), "-o",
                            str(exe), "-lm"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    bad, plain = map(int, subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split())
    assert bad == 0, f"{bad} carried values differ from the divisions"
    # every run with W <= 0 (3 of the 10 values) took the plain loop, and no other
    assert plain == 3 * 14 * 4 * 9 * len(funcs), plain


@pytest.mark.parametrize("isa", ["", "baseline"])
def test_carried_grid_divisions_match_onnxruntime(tmp_path: Path, isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVONNX_COST_MODEL", "defaults")
    path = _grid(tmp_path)
    out = tmp_path / "o.onnx"
    dump = tmp_path / "dump"
    evonnx.optimize(path, out, sizes={"H": 7, "W": 5, "N": 105}, dump_dir=dump)
    assert "cd0 > 0" in (dump / "kernels.c").read_text(), "the grid's divisions were not carried"
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    monkeypatch.setenv("EVONNX_CPU_ISA", isa)
    got = evonnx.load_session(out)
    rng = np.random.default_rng(3)
    for h, w, n in [(7, 5, 105), (1, 1, 3), (4, 9, 1), (3, 3, 27), (2, 1, 6), (1, 2, 1), (0, 5, 1), (6, 0, 1),
                    (0, 0, 0), (3, 5, 44)]:
        feeds = {"a": rng.standard_normal((w, h)).astype(np.float32), "flags": rng.random(n) < 0.5}
        try:
            (r,) = ref.run(None, feeds)
        except Exception:  # noqa: BLE001 - onnxruntime's error types vary; the optimized model must fail too
            with pytest.raises(Exception):  # noqa: B017
                got.run(None, feeds)
            continue
        (g,) = got.run(None, feeds)
        np.testing.assert_array_equal(g, r, err_msg=f"H={h} W={w} N={n}")


def test_valid_flags_divisions_are_carried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """models/valid_flags.onnx: each anchor's cell row and column, two divisions by run-time sizes per element
    (461 -> 181 us carried, 100,800 anchors, 1 thread)."""
    monkeypatch.setenv("EVONNX_COST_MODEL", "defaults")
    out = tmp_path / "v.onnx"
    dump = tmp_path / "dump"
    evonnx.optimize(MODELS / "valid_flags.onnx", out, sizes={"H": 12, "W": 10, "N": 360}, dump_dir=dump)
    assert "cd0 > 0" in (dump / "kernels.c").read_text()
    ref = ort.InferenceSession(str(MODELS / "valid_flags.onnx"), providers=["CPUExecutionProvider"])
    got = evonnx.load_session(out)
    rng = np.random.default_rng(5)
    for h, w in [(12, 10), (1, 7), (5, 1), (3, 4)]:
        n = 3 * h * w
        feeds = {"feat": np.zeros((1, 8, h, w), np.float32),
                 "anchors": (rng.random((n, 4)) * 120 - 10).astype(np.float32),
                 "pad_shape": np.array([8 * h - 5, 8 * w - 3], np.int64),
                 "img_shape": np.array([8 * h - 9, 8 * w - 7], np.float32)}
        (r,), (g,) = ref.run(None, feeds), got.run(None, feeds)
        np.testing.assert_array_equal(g, r, err_msg=f"H={h} W={w}")
