"""Clean failure (issue 8): every failure of `evonnx optimize` is one `evonnx: error:` line and a non-zero exit,
nothing is written, no temporary file or folder is left (in the output folder or the temp folder, Ctrl-C
included), and an input is never overwritten. Relative paths work for serving.

Each case runs the CLI in a subprocess with a private TMPDIR, and checks the exit status, that stderr is exactly
one line, that the output folder's listing is unchanged and that the private TMPDIR is empty.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import evonnx

ROOT = Path(__file__).resolve().parents[1]
F32, I64 = TensorProto.FLOAT, TensorProto.INT64

# Runs the CLI after replacing one function by a stand-in: "pause" writes READY and sleeps (the test then sends
# a signal), "raise" raises a RuntimeError (a bug). The points cover each phase of `optimize`.
HARNESS = """
import sys, time, importlib
point, action, ready, *args = sys.argv[1:]
module, name = {
    "load": ("evonnx.api", "load_model"),
    "pipeline": ("evonnx.passes.pipeline", "run_pipeline"),
    "build": ("evonnx.kernels.build", "_run_compiler"),
    "check": ("evonnx.api", "check_models"),
    "report": ("evonnx.report", "report_json"),
}[point]
mod = importlib.import_module(module)
real = getattr(mod, name)
def stand_in(*a, **k):
    if action == "raise":
        raise RuntimeError("boom\\nsecond line")
    open(ready, "w").close()
    time.sleep(60)
    return real(*a, **k)
setattr(mod, name, stand_in)
from evonnx.cli import main
main(args, prog_name="evonnx")
"""


def _save(path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto] | None = None) -> Path:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits or [])
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
                     .SerializeToString())
    return path


def _tiny(path: Path, dims: list[int | str] | None = None) -> Path:
    """Neg -> Abs: two fusible nodes, so a run goes through every phase (plan, build, check)."""
    dims = dims if dims is not None else [2, 3]
    return _save(path, [helper.make_node("Neg", ["x"], ["t"]), helper.make_node("Abs", ["t"], ["y"])],
                 [helper.make_tensor_value_info("x", F32, dims)], [helper.make_tensor_value_info("y", F32, dims)])


def _external(path: Path, location: str) -> Path:
    """`y = |x + w|` with `w` stored in external data at `location`."""
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "24")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    return _save(path, [helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node("Abs", ["t"], ["y"])],
                 [helper.make_tensor_value_info("x", F32, [2, 3])], [helper.make_tensor_value_info("y", F32, [2, 3])],
                 [w])


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in sorted(folder.rglob("*"))}


class Workspace:
    """A model folder, an output folder and a private TMPDIR, and the CLI run against them."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path
        self.src, self.out, self.tmp = tmp_path / "src", tmp_path / "out", tmp_path / "tmp"
        for d in (self.src, self.out, self.tmp):
            d.mkdir()
        self.env = {**os.environ, "TMPDIR": str(self.tmp),
                    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.env.pop("ORT_DISABLE_TELEMETRY", None)  # the CLI itself must keep onnxruntime's files out of TMPDIR

    def command(self, args: list[str], point: str | None = None, action: str = "pause") -> list[str]:
        if point is None:
            return [sys.executable, "-m", "evonnx", *args]
        return [sys.executable, "-c", HARNESS, point, action, str(self.root / "ready"), *args]

    def run(self, args: list[str], point: str | None = None, action: str = "pause"
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(args, point, action), capture_output=True, text=True, timeout=120,
                              env=self.env)

    def fails_cleanly(self, args: list[str], needle: str, *, point: str | None = None, action: str = "pause",
                      code: int = 1, prefix: str = "evonnx: error: ") -> str:
        before = {d: _listing(d) for d in (self.src, self.out)}
        proc = self.run(args, point, action)
        assert proc.returncode == code, proc.stderr
        return self.assert_clean(proc.stderr, proc.stdout, before, needle, prefix)

    def assert_clean(self, stderr: str, stdout: str, before: dict[Path, dict[str, bytes]], needle: str,
                     prefix: str = "evonnx: error: ") -> str:
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(prefix), stderr
        assert needle in lines[0], lines[0]
        assert stdout == ""
        for d, listing in before.items():
            assert _listing(d) == listing, f"{d} changed"
        assert list(self.tmp.iterdir()) == [], "left in TMPDIR"
        return lines[0]


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def _make_read_only(folder: Path) -> None:
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return
    # root ignores permissions: make the folder immutable instead, where the filesystem supports it
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("running as root and the temp filesystem has no immutable attribute")


def _make_writable(folder: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    else:
        folder.chmod(0o755)


# --------------------------------------------------------------------------------------------------------------
# Outputs that cannot be written, or would overwrite the input: refused before any work
# --------------------------------------------------------------------------------------------------------------
def test_optimize_read_only_output_folder_fails_cleanly(ws: Workspace) -> None:
    src = _tiny(ws.src / "m.onnx")
    _make_read_only(ws.out)
    try:
        ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")], "cannot write to the output folder")
    finally:
        _make_writable(ws.out)


def test_optimize_output_naming_a_folder_fails_cleanly(ws: Workspace) -> None:
    src = _tiny(ws.src / "m.onnx")
    (ws.out / "sub").mkdir()
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "sub")], "the output path is a folder")
    (ws.out / "m.evonnx.so").mkdir()  # the library path a folder
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.onnx")], "the kernel library path is a folder")


def test_optimize_report_into_missing_folder_writes_no_model(ws: Workspace) -> None:
    src = _tiny(ws.src / "m.onnx")
    report = ws.out / "no" / "r.json"
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx"), "--report", str(report)],
                     "report folder does not exist")


def test_optimize_report_naming_a_folder_fails_cleanly(ws: Workspace) -> None:
    src = _tiny(ws.src / "m.onnx")
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx"), "--report", str(ws.src)],
                     "the report path is a folder")


@pytest.mark.parametrize("link", ["same", "hard", "symbolic"])
def test_optimize_library_path_never_overwrites_the_input(ws: Workspace, link: str) -> None:
    """`optimize m.evonnx.so -o m.onnx`: the library of m.onnx is m.evonnx.so, the input."""
    src = _tiny(ws.out / "m.evonnx.so")
    lib = ws.out / "m.evonnx.so"
    if link != "same":
        lib = ws.out / "n.evonnx.so"
        os.link(src, lib) if link == "hard" else lib.symlink_to(src.name)
    ws.fails_cleanly(["optimize", str(src), "-o", str(lib.with_name(lib.name.replace(".evonnx.so", ".onnx")))],
                     "writing the kernel library would overwrite the input")


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_optimize_output_linked_to_the_input_is_refused(ws: Workspace, link: str) -> None:
    src = _tiny(ws.out / "m.onnx")
    dst = ws.out / "m.opt.onnx"
    os.link(src, dst) if link == "hard" else dst.symlink_to(src.name)
    ws.fails_cleanly(["optimize", str(src), "-o", str(dst)], "writing the output would overwrite the input")


def test_optimize_report_over_the_model_is_refused(ws: Workspace) -> None:
    src = _tiny(ws.src / "m.onnx")
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx"), "--report", str(src)],
                     "writing the report would overwrite the input")
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx"), "--report",
                      str(ws.out / "m.opt.onnx")], "the report and the output would be the same file")


# --------------------------------------------------------------------------------------------------------------
# Bad or huge sizes, bad external data
# --------------------------------------------------------------------------------------------------------------
def test_optimize_negative_declared_dim_fails_cleanly(ws: Workspace) -> None:
    src = _tiny(ws.src / "m.onnx", [-1, 3])
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")], "input 'x' declares dim 0 as -1")


def test_optimize_huge_declared_dim_fails_cleanly_without_allocating(ws: Workspace) -> None:
    """2**40 x 3 floats would be 24 TiB of check input: refused in a blink, with a way out."""
    src = _tiny(ws.src / "m.onnx", [2**40, 3])
    t0 = time.perf_counter()
    line = ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")], "1099511627776")
    assert "--no-check" in line
    assert time.perf_counter() - t0 < 60


def test_optimize_range_of_2_40_fails_cleanly_without_allocating(ws: Workspace) -> None:
    """`Range(0, 2**40)` (8 TiB of int64): ONNX's data propagation would materialise it at load, and the check
    would ask onnxruntime for it; neither happens."""
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("s", 0), ("e", 2**40), ("d", 1))]
    src = _save(ws.src / "m.onnx", [helper.make_node("Range", ["s", "e", "d"], ["r"]),
                                    helper.make_node("Add", ["r", "x"], ["t"]), helper.make_node("Abs", ["t"], ["y"])],
                [helper.make_tensor_value_info("x", I64, [1])], [helper.make_tensor_value_info("y", I64, ["n"])],
                consts)
    line = ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")], "1099511627776 elements")
    assert "--no-check" in line


def test_plan_time_folding_skips_a_pad_by_2_40(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A node left to onnxruntime with constant inputs is evaluated at plan time, unless its output is known to
    be huge: a Pad of a constant by 2**40 would make onnxruntime allocate 4 TiB."""
    import logging

    from evonnx.model import load_model
    from evonnx.passes.pipeline import run_pipeline

    consts = [numpy_helper.from_array(np.ones(1, np.float32), "c"),
              numpy_helper.from_array(np.array([0, 2**40], np.int64), "p")]
    src = _save(tmp_path / "m.onnx", [helper.make_node("Pad", ["c", "p"], ["padded"]),
                                      helper.make_node("Add", ["padded", "x"], ["t"]),
                                      helper.make_node("Abs", ["t"], ["y"])],
                [helper.make_tensor_value_info("x", F32, [1])], [helper.make_tensor_value_info("y", F32, ["n"])],
                consts)
    with caplog.at_level(logging.DEBUG, logger="evonnx.passes.analyze"):
        run_pipeline(load_model(src), planner="greedy")
    assert any("its output would have more than" in r.getMessage() for r in caplog.records)


def test_optimize_missing_external_data_fails_cleanly(ws: Workspace) -> None:
    src = _external(ws.src / "m.onnx", "weights.bin")
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")], "'weights.bin', which is missing")


def test_optimize_truncated_external_data_fails_cleanly(ws: Workspace) -> None:
    src = _external(ws.src / "m.onnx", "weights.bin")
    (ws.src / "weights.bin").write_bytes(b"\0" * 10)
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")], "which has 10 bytes")


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_optimize_external_data_outside_the_model_folder_is_refused_unread(ws: Workspace, where: str) -> None:
    """The target is a FIFO: had evonnx or onnx opened it to read, the run would block until the timeout."""
    fifo = ws.root / "secret"
    os.mkfifo(fifo)
    location = {"parent": "../secret", "absolute": str(fifo), "symlink": "data.bin"}[where]
    if where == "symlink":
        (ws.src / "data.bin").symlink_to(fifo)
    src = _external(ws.src / "m.onnx", location)
    needle = {"parent": "must not leave the model's folder", "absolute": "must be a relative path",
              "symlink": "leads outside the model's folder"}[where]
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")], needle)


def _trapping_div(path: Path) -> Path:
    """A constant int64 Div of INT64_MIN by -1: the x86 division traps (SIGFPE) in onnxruntime's constant
    folding and in its Div kernel alike, so plain onnxruntime dies loading this model."""
    consts = [numpy_helper.from_array(np.array([np.iinfo(np.int64).min, 4], np.int64), "a"),
              numpy_helper.from_array(np.array([-1, 2], np.int64), "b")]
    return _save(path, [helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Add", ["x", "q"], ["s"]),
                        helper.make_node("Mul", ["s", "s"], ["y"])],
                 [helper.make_tensor_value_info("x", I64, ["N", 2])],
                 [helper.make_tensor_value_info("y", I64, ["N", 2])], consts)


@pytest.mark.parametrize("fold", ["1", "0"])
def test_optimize_a_model_that_crashes_onnxruntime_fails_cleanly(ws: Workspace, fold: str) -> None:
    """onnxruntime dies on the model (SIGFPE) where evonnx first runs it: at its constant folding, or (with
    plan-time folding off) in the check. Either way evonnx survives it: one line naming the signal and the step,
    exit 1, nothing written, the worker's temporary folder gone."""
    src = _trapping_div(ws.src / "m.onnx")
    ws.env["EVONNX_ORT_FOLD"] = fold
    needle = ("onnxruntime crashed (SIGFPE) while loading the model" if fold == "1" else
              "cannot check: onnxruntime crashed (SIGFPE) while loading the original model")
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")], needle)


def test_optimize_a_model_that_crashes_onnx_shape_inference_fails_cleanly(ws: Workspace) -> None:
    """A Split of a dim of 1 into 3 parts (opset 18's num_outputs), then a Slice of the last part: ONNX's shape
    inference gives that part a dim of -1 and aborts its process on an assertion in the Slice's inference
    (std::clamp), as onnxruntime does loading the model (fuzz case 29 of seed 2, session 28). evonnx runs the
    inference in its worker: one line naming it, exit 1, nothing written."""
    src = ws.src / "m.onnx"
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=0, num_outputs=3),
             helper.make_node("Slice", ["c", "s", "e", "k"], ["y"])]
    consts = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("s", 2), ("e", 3), ("k", -1))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [1])],
                          [helper.make_tensor_value_info("y", F32, None)], consts)
    src.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
                    .SerializeToString())
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")],
                     "ONNX shape inference fails: ONNX shape inference crashed (SIGABRT)")


def _bfloat16_model(path: Path) -> Path:
    """bfloat16 in, Cast to float, Transpose and Neg (fusable), float out."""
    nodes = [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT), helper.make_node("Transpose", ["f"], ["t"]),
             helper.make_node("Neg", ["t"], ["y"])]
    return _save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["N", 4])],
                 [helper.make_tensor_value_info("y", F32, [4, "N"])])


def test_optimize_a_bfloat16_model_cannot_be_checked_and_says_so(ws: Workspace) -> None:
    """onnxruntime's Python API has no numpy type for bfloat16 (nor float8, 4-bit), so the check cannot feed the
    model: one line saying so, exit 1, nothing written, no graphsurgeon "[W]" lines (it was an internal error)."""
    src = _bfloat16_model(ws.src / "m.onnx")
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")],
                     "cannot check: input 'x' is bfloat16, which onnxruntime's Python API cannot feed or return; "
                     "skip the check with --no-check")


@pytest.mark.compiler
def test_optimize_a_bfloat16_model_without_the_check(ws: Workspace) -> None:
    """With --no-check it is optimized; the guard says why it timed nothing, and the kernel matches onnxruntime."""
    import onnxruntime as ort

    src = _bfloat16_model(ws.src / "m.onnx")
    ws.env["EVONNX_GUARD"] = "1"  # (the suite's default is off)
    proc = ws.run(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx"), "--no-check"])
    assert proc.returncode == 0 and "[W]" not in proc.stderr, proc.stderr
    assert "guard: skipped: no input set runs on the original (input 'x' is bfloat16" in proc.stdout
    assert "1 fused kernels" in proc.stdout
    bf16 = onnx.helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)
    x = np.array([[1, -2, 3, 4.5], [0, 7, -8, 9], [-0.0, 1e-3, 300, -1]], np.float32).astype(bf16)
    value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x.view(np.uint16), TensorProto.BFLOAT16)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run_with_ort_values(
        None, {"x": value})[0].numpy()
    got = evonnx.load_session(ws.out / "m.opt.onnx").run_with_ort_values(None, {"x": value})[0].numpy()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, -x.astype(np.float32).T)


def _foreign_op_model(path: Path) -> Path:
    """Abs, Neg, Sigmoid (fusable), then an op of another library's domain, which plain onnxruntime cannot load."""
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["c"]), helper.make_node("Bar", ["c"], ["y"], domain="com.foo")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [4, 8])],
                          [helper.make_tensor_value_info("y", F32, [4, 8])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.foo", 1)],
                              ir_version=8)
    path.write_bytes(model.SerializeToString())
    return path


def test_optimize_a_model_with_another_librarys_op_cannot_be_checked_and_says_so(ws: Workspace) -> None:
    src = _foreign_op_model(ws.src / "m.onnx")
    ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")],
                     "cannot check: onnxruntime cannot load the original model")


@pytest.mark.compiler
def test_optimize_a_model_with_another_librarys_op_without_the_check(ws: Workspace) -> None:
    """With --no-check it is optimized (the op left as it was) and the guard says why it timed nothing: it was an
    internal error. The load test that --no-check still runs lets it through: neither model loads without that
    library."""
    src = _foreign_op_model(ws.src / "m.onnx")
    ws.env["EVONNX_GUARD"] = "1"  # (the suite's default is off)
    proc = ws.run(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx"), "--no-check"])
    assert proc.returncode == 0, proc.stderr
    assert "guard: skipped: no input set runs on the original (onnxruntime cannot load the original model" \
        in proc.stdout
    nodes = onnx.load(ws.out / "m.opt.onnx").graph.node
    assert [(n.domain, n.op_type) for n in nodes] == [("ai.evonnx", "Fused"), ("com.foo", "Bar")]


@pytest.mark.compiler
def test_optimize_build_failure_is_one_line_and_leaves_no_build_folder(ws: Workspace) -> None:
    src = _tiny(ws.src / "m.onnx")
    line = ws.fails_cleanly(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx"), "--cflag=-bogus-flag"],
                            "-bogus-flag")
    assert line.startswith("evonnx: error: compiling the kernels of 'm.opt.onnx' failed (source: ")
    kept = Path(line.split("(source: ")[1].split(")")[0])  # a copy for bug reports, in the cache, not a temp file
    assert kept.is_file()
    kept.unlink()
    with contextlib.suppress(OSError):
        kept.parent.rmdir()


# --------------------------------------------------------------------------------------------------------------
# Ctrl-C and bugs: one line, nothing left
# --------------------------------------------------------------------------------------------------------------
def _needs_compiler(point: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.compiler] if point in ("build", "check", "report") else []


@pytest.mark.parametrize("point, signum", [
    pytest.param(p, s, marks=_needs_compiler(p), id=f"{p}-{s.name}")
    for p, s in (("load", signal.SIGINT), ("build", signal.SIGINT), ("check", signal.SIGINT),
                 ("report", signal.SIGINT), ("check", signal.SIGTERM))])
def test_optimize_interrupted_prints_one_line_and_leaves_nothing(ws: Workspace, point: str,
                                                                 signum: signal.Signals) -> None:
    src = _tiny(ws.src / "m.onnx")
    args = ["optimize", str(src), "-o", str(ws.out / "m.opt.onnx"), "--report", str(ws.out / "r.json")]
    before = {d: _listing(d) for d in (ws.src, ws.out)}
    # as from a terminal: SIGINT handled by default even when this test runs as a background job (which ignores it)
    proc = subprocess.Popen(ws.command(args, point), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ws.env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (ws.root / "ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        assert any(p.name.startswith(".evonnx-") for p in ws.out.iterdir()), "the outputs are staged by now"
        if point == "build":
            assert any(p.name.startswith("evonnx-build-") for p in ws.tmp.iterdir()), "the build folder exists"
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, stderr
    ws.assert_clean(stderr, stdout, before, "interrupted")
    assert stderr == "evonnx: error: interrupted\n"


def test_optimize_internal_error_is_one_line_and_leaves_nothing(ws: Workspace) -> None:
    src = _tiny(ws.src / "m.onnx")
    args = ["optimize", str(src), "-o", str(ws.out / "m.opt.onnx")]
    line = ws.fails_cleanly(args, "RuntimeError: boom", point="pipeline", action="raise", code=70,
                            prefix="evonnx: internal error: ")
    assert "-vv" in line
    proc = ws.run(["-vv", *args], point="pipeline", action="raise")
    assert proc.returncode == 70 and "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("evonnx: internal error: RuntimeError: boom")


# --------------------------------------------------------------------------------------------------------------
# Success leaves exactly the outputs; serving works with bare relative names
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.compiler
def test_optimize_success_leaves_only_its_outputs(ws: Workspace) -> None:
    src = _tiny(ws.src / "m.onnx")
    proc = ws.run(["optimize", str(src), "-o", str(ws.out / "m.opt.onnx"), "--report", str(ws.src / "r.json")])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert sorted(_listing(ws.out)) == ["m.opt.evonnx.so", "m.opt.onnx"]
    assert sorted(_listing(ws.src)) == ["m.onnx", "r.json"]
    assert list(ws.tmp.iterdir()) == []
    umask = os.umask(0)
    os.umask(umask)
    assert (ws.out / "m.opt.onnx").stat().st_mode & 0o777 == 0o666 & ~umask  # not a temp file's 0600


@pytest.mark.compiler
def test_load_session_and_readme_snippet_accept_bare_relative_names(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime as ort

    _tiny(tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    evonnx.optimize("m.onnx", "m.opt.onnx")
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    (got,) = evonnx.load_session("m.opt.onnx").run(None, {"x": x})
    np.testing.assert_array_equal(got, np.abs(x))
    so = ort.SessionOptions()  # README "Serving an optimized model"
    so.register_custom_ops_library(os.path.abspath("m.opt.evonnx.so"))
    sess = ort.InferenceSession("m.opt.onnx", so, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.abs(x))
