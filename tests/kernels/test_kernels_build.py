"""Building model libraries: caching, what the .so exports and needs, error messages, and a plain-C host."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fused_models import ADD_INDEX_INPUTS, ADD_INDEX_OUTPUTS, fused_model

from evonnx.errors import BuildError
from evonnx.kernels import build

HERE = Path(__file__).resolve().parent
FETCH_SCRIPT = Path(build.__file__).resolve().parent / "fetch_ort_headers.sh"


def test_ort_headers_dir_explicit_folder_must_hold_the_c_api(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="has no onnxruntime_c_api.h"):
        build.ort_headers_dir(tmp_path)


def test_ort_headers_dir_env_folder_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 21\n")
    monkeypatch.setenv("EVONNX_ORT_HEADERS", str(tmp_path))
    assert build.ort_headers_dir() == tmp_path


def test_ort_headers_dir_rejects_old_headers(tmp_path: Path) -> None:
    (tmp_path / "onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 16\n")
    with pytest.raises(BuildError, match="is ORT API 16; evonnx needs >= 21"):
        build.ort_headers_dir(tmp_path)


def test_fetch_script_returns_at_once_when_stamped(tmp_path: Path) -> None:
    (tmp_path / ".ort-headers").write_text("libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb\n")
    result = subprocess.run(
        ["sh", str(FETCH_SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=5
    )
    assert result.returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ort-headers"]


def test_fetch_script_requires_a_destination() -> None:
    result = subprocess.run(["sh", str(FETCH_SCRIPT)], capture_output=True, text=True, timeout=5)
    assert result.returncode != 0 and "usage:" in result.stderr


@pytest.mark.compiler
def test_runtime_object_is_compiled_once(
    ort_headers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVONNX_CACHE_DIR", str(tmp_path))
    first = build.runtime_object(ort_headers)
    assert first.parent == tmp_path / "runtime" and first.is_file()
    stat = first.stat()

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached runtime object was rebuilt")

    monkeypatch.setattr(build, "_run_compiler", no_compiler)
    second = build.runtime_object(ort_headers)
    assert second == first
    assert (second.stat().st_ino, second.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert [p.name for p in (tmp_path / "runtime").iterdir()] == [first.name]  # no partial files left


@pytest.mark.compiler
def test_library_exports_only_register_custom_ops(kernel_library: Path) -> None:
    result = subprocess.run(
        ["nm", "-D", "--defined-only", str(kernel_library)], capture_output=True, text=True, check=True
    )
    assert [line.split()[-1] for line in result.stdout.splitlines()] == ["RegisterCustomOps"]


@pytest.mark.compiler
def test_library_needs_no_onnxruntime(kernel_library: Path) -> None:
    result = subprocess.run(
        ["readelf", "-d", str(kernel_library)], capture_output=True, text=True, check=True
    )
    needed = {line.split("[")[1].rstrip("]") for line in result.stdout.splitlines() if "(NEEDED)" in line}
    assert needed <= {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1"}, needed


@pytest.mark.compiler
def test_compiler_error_names_the_kept_source(ort_headers: Path, tmp_path: Path) -> None:
    with pytest.raises(BuildError) as info:
        build.build_model_library(
            "int broken(void) { return }\n", tmp_path / "m.evonnx.so", model_name="m.onnx"
        )
    message = str(info.value)
    assert message.startswith("compiling the kernels of 'm.onnx' failed (source: ")
    assert "error: expected expression" in message
    assert _take_kept_source(message) == "int broken(void) { return }\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.compiler
def test_missing_kernel_table_fails_at_link_time(ort_headers: Path, tmp_path: Path) -> None:
    with pytest.raises(BuildError) as info:
        build.build_model_library('#include "evonnx_abi.h"\n', tmp_path / "m.evonnx.so", model_name="m.onnx")
    message = str(info.value)
    assert message.startswith("linking the library of 'm.onnx' failed (source: ")
    # ld.bfd quotes `evo_kernel_table', gold 'evo_library_model' (whichever undefined symbol it meets first)
    assert re.search(r"undefined reference to [`'](evo_kernel_table|evo_kernel_count|evo_library_model)'", message)
    _take_kept_source(message)
    assert list(tmp_path.iterdir()) == []


def _take_kept_source(message: str) -> str:
    """The text of the source a BuildError says it kept; removes it and its build folder."""
    kept = Path(message.split("(source: ")[1].split(")")[0])
    text = kept.read_text()
    for leftover in kept.parent.iterdir():
        leftover.unlink()
    kept.parent.rmdir()
    return text


@pytest.mark.compiler
def test_c_host_runs_the_model_without_python(
    kernel_library: Path, ort_headers: Path, tmp_path: Path
) -> None:
    # The wheel's library has SONAME libonnxruntime.so.1 but no file by that name, and no unversioned link.
    wheel_libs = sorted((Path(ort.__file__).parent / "capi").glob("libonnxruntime.so.1.*"))
    assert wheel_libs, "the onnxruntime wheel has no libonnxruntime.so.1.*"
    for name in ("libonnxruntime.so.1", "libonnxruntime.so"):
        (tmp_path / name).symlink_to(wheel_libs[-1])
    host = tmp_path / "c_host"
    subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-O1",
            "-Wall",
            "-Werror",
            str(HERE / "c_host.c"),
            f"-I{ort_headers}",
            f"-L{tmp_path}",
            "-lonnxruntime",
            f"-Wl,-rpath,{tmp_path}",
            "-o",
            str(host),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    model_path = tmp_path / "model.onnx"
    onnx.save(fused_model("k_add_index", ADD_INDEX_INPUTS, ADD_INDEX_OUTPUTS), model_path)

    n = 5
    result = subprocess.run(
        [str(host), str(model_path), str(kernel_library), str(n)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    x = np.arange(n, dtype=np.float32)[:, None] + np.arange(4, dtype=np.float32) / 4
    idx = np.arange(n) - 1
    np.testing.assert_array_equal(np.array(lines["y"].split(), np.float32), (x + idx[:, None]).ravel())
    assert lines["positive"].split() == [str(int(v > 0)) for v in idx]


@pytest.mark.compiler
def test_c_host_reports_an_unknown_kernel(kernel_library: Path, ort_headers: Path, tmp_path: Path) -> None:
    wheel_libs = sorted((Path(ort.__file__).parent / "capi").glob("libonnxruntime.so.1.*"))
    for name in ("libonnxruntime.so.1", "libonnxruntime.so"):
        (tmp_path / name).symlink_to(wheel_libs[-1])
    host = tmp_path / "c_host"
    subprocess.run(
        [
            "gcc",
            "-std=c11",
            str(HERE / "c_host.c"),
            f"-I{ort_headers}",
            f"-L{tmp_path}",
            "-lonnxruntime",
            f"-Wl,-rpath,{tmp_path}",
            "-o",
            str(host),
        ],
        check=True,
    )
    model_path = tmp_path / "model.onnx"
    onnx.save(fused_model("k_gone", ADD_INDEX_INPUTS, ADD_INDEX_OUTPUTS), model_path)
    result = subprocess.run(
        [str(host), str(model_path), str(kernel_library), "2"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "has no kernel 'k_gone'" in result.stderr


@pytest.mark.compiler
def test_large_sources_build_as_parallel_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two kernels (a MatMul, left to onnxruntime, between them), built as the tail's unit plus one unit per kernel
    # at once: the table must reach the kernels of the other units, and the model must still match onnxruntime.
    from onnx import TensorProto, helper, numpy_helper

    import evonnx

    monkeypatch.setattr(build, "PARALLEL_BUILD_CHARS", 0)
    monkeypatch.setenv("EVONNX_BUILD_JOBS", "3")
    units: list[int] = []
    real = build._run_compilers

    def counting(commands: list[tuple[list[str], Path]], what: str) -> None:
        units.append(len(commands))
        real(commands, what)

    monkeypatch.setattr(build, "_run_compilers", counting)
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Exp", ["a"], ["b"]),
         helper.make_node("MatMul", ["b", "w"], ["m"]), helper.make_node("Abs", ["m"], ["c"]),
         helper.make_node("Sigmoid", ["c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", f, ["N", 8])], [helper.make_tensor_value_info("y", f, ["N", 8])],
        [numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), "w")])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))
    result = evonnx.optimize(src, tmp_path / "m.opt.onnx")  # checks against onnxruntime on the original
    assert len(result.kernels) == 2 and units == [3]
    sess = evonnx.load_session(tmp_path / "m.opt.onnx")
    x = np.linspace(-2, 2, 40, dtype=np.float32).reshape(5, 8)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5)


MODELS = sorted((HERE.parents[1] / "models").glob("*.onnx"))


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_models_kernels_are_standard_c_without_a_warning(path: Path) -> None:
    # Issue 13: the generated C reads like hand-written code. Every models/ model's kernels are standard C that
    # compiles with -std=c11 -pedantic -Wall -Wextra -Werror and no pragma silencing a warning: a piece declares
    # only the inputs, outputs and sizes it reads, and a reduction is statements before the one using its result
    # (a GNU statement expression is left only under a guarded select, where its reads must not run untaken).
    from evonnx.kernels.codegen_c import generate
    from evonnx.model import load_model
    from evonnx.passes.ort_layout import fold_like_onnxruntime
    from evonnx.passes.pipeline import run_pipeline
    from evonnx.toolchain import c_compiler, kernel_cflags

    cc = c_compiler()
    if cc is None:
        pytest.skip("no C compiler")
    model = load_model(path)
    result = run_pipeline(fold_like_onnxruntime(model) or model)
    assert result.specs, "every models/ model has a fused kernel"
    source = generate(result.specs, path.name)
    assert "#pragma GCC diagnostic" not in source
    assert "({" not in source
    strict = ["-std=c11", "-pedantic", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"]
    proc = subprocess.run([cc, *kernel_cflags(cc), *strict,
                           f"-I{build._RUNTIME_DIR}", "-x", "c", "-"], input=source, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_pieces_split_at_selects_through_unrolled_axes_and_remainders() -> None:
    # A Concat of pyramid levels read through a flattened index with the box axis unrolled (mmyolo YOLOv5,
    # mmdet RetinaNet): the select is on fmod(i1 + i2 - 1, 100) < 60. Taken at each unrolled i2, with the wrap of
    # the remainder, it splits i1 where it changes branch, so no select and no division is left in a loop (the
    # bboxes kernel went from 1.37 ms to 0.73 ms).
    from evonnx.expr import Load, binary, const, index_val, where
    from evonnx.index import Poly, mod, var
    from evonnx.kernels.pieces import pieces
    from evonnx.records import KernelOutput

    i1, i2 = var("i1", 100), var("i2", 4)
    pos = mod(i1 + i2 - 1, 100)
    cond = binary("lt", index_val(pos), const(60, "int64"))
    e = where(cond, Load(0, pos, "float32"), Load(1, pos, "float32"))
    o = KernelOutput("y", "float32", (Poly.of(100), Poly.of(4)), (i1, i2), e, ())
    bounds = sorted({(int(r[0][0].const), int(r[0][1].const)) for r in (p.ranges for p in pieces(o))})
    starts = {a for a, _ in bounds}
    # branch changes at i1 + i2 - 1 == 60 (i1 = 61, 60, 59, 58 for i2 = 0..3) and wraps at i1 = 1 (i2 = 0) and
    # i1 = 99, 98 (i2 = 2, 3)
    assert {58, 59, 60, 61, 1, 98, 99} <= starts, bounds
    assert bounds[0][0] == 0 and bounds[-1][1] == 100 and all(a < b for a, b in bounds)
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(bounds, bounds[1:]))


def test_split_points_skip_unrolled_values_where_the_condition_reads_out_of_range() -> None:
    # A select whose condition reads an index table at i2 - 1 is only taken for i2 >= 1: at i2 = 0 the table would
    # be read at -1 (found by the writes-through-views property test). That value says nothing about where to
    # split; the others still split i1.
    from evonnx.expr import Load, binary, const, index_val, where
    from evonnx.index import Poly, Table, lookup, var
    from evonnx.kernels.pieces import pieces
    from evonnx.records import KernelOutput

    i1, i2 = var("i1", 100), var("i2", 4)
    tab = Table("tab", (1, 1, 0, 1))
    cond = binary("lt", index_val(i1 + 10 * lookup(tab, i2 - 1)), const(50, "int64"))
    inner = where(cond, Load(0, i1, "float32"), Load(1, i1, "float32"))
    e = where(binary("ge", index_val(i2), const(1, "int64")), inner, Load(2, i1, "float32"))
    o = KernelOutput("y", "float32", (Poly.of(100), Poly.of(4)), (i1, i2), e, ())
    starts = {int(p.ranges[0][0].const) for p in pieces(o)}
    assert {40, 50} <= starts, starts


def test_a_small_outer_axis_is_split_where_a_select_changes_branch() -> None:
    # ultralytics' boxes [1, 4, A]: rows 0-1 (x, y: fmod(2 + i1, 4) reads the other half) and rows 2-3 (w, h). The
    # row axis is outside the anchors, so it is a loop, not unrolled: its select is split into pieces [0, 2) and
    # [2, 4), where it had stayed in every element, with its branches' reductions recomputed there (27.5 ms for
    # yolov8n's head against 4.8 ms in onnxruntime)
    from evonnx.expr import Load, binary, const, index_val, where
    from evonnx.index import Poly, mod, var
    from evonnx.kernels.pieces import pieces
    from evonnx.records import KernelOutput

    i1, i2 = var("i1", 4), var("i2", 8400)
    other = Load(0, 8400 * mod(i1 + 2, 4) + i2, "float32")
    e = where(binary("lt", index_val(i1), const(2, "int64")), binary("add", Load(0, 8400 * i1 + i2, "float32"), other),
              binary("sub", other, Load(0, 8400 * mod(i1, 4) + i2, "float32")))
    o = KernelOutput("y", "float32", (Poly.of(4), Poly.of(8400)), (i1, i2), e, ())
    rows = sorted((int(p.ranges[0][0].const), int(p.ranges[0][1].const)) for p in pieces(o))
    assert rows == [(0, 2), (2, 4)], rows
    # the same select on the innermost axis stays in the element: that axis is unrolled, its conditions fold
    j1, j2 = var("j1", 8400), var("j2", 4)
    inner = where(binary("lt", index_val(j2), const(2, "int64")), Load(0, 4 * j1 + mod(j2 + 2, 4), "float32"),
                  Load(0, 4 * j1 + j2, "float32"))
    o2 = KernelOutput("y", "float32", (Poly.of(8400), Poly.of(4)), (j1, j2), inner, ())
    assert len(pieces(o2)) == 1
