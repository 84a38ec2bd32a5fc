"""One deterministic regression per bug class of the security issue: each model is optimized and run next to
onnxruntime by the fuzzer's oracle (child processes, sizes including 0 and 1), and must behave as onnxruntime
does: the same outputs, or an error wherever onnxruntime errors; no code from a name runs, nothing crashes.

The models (sec_models.REGRESSIONS) have fusible nodes around the op under test, and the test requires a Fused
kernel, so it cannot pass because evonnx left everything to onnxruntime (except for models that are invalid at
every size, which evonnx may refuse).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from sec_cases import I64_MAX, case_from_finding, case_from_model
from sec_models import REGRESSIONS, make_model, node
from sec_oracle import check_case, finding_planner
from sec_payloads import TEMPLATES, Canary, escaped_identifiers, payload

pytestmark = pytest.mark.compiler

F = TensorProto.FLOAT


def _check(model: onnx.ModelProto, plans: Sequence[dict[str, int]], tmp_path: Path, *, exact: bool = True,
           file_name: str = "model.opt.onnx", marker: Path | None = None, require_kernel: bool = True,
           regime: str = "small") -> None:
    case = case_from_model(model, plans, exact=exact, file_name=file_name, value_regime=regime)
    outcome = check_case(case, tmp_path / "case", marker or tmp_path / "no-marker")
    if outcome.findings:
        pytest.fail("\n".join([case.describe()] + outcome.findings), pytrace=False)
    if require_kernel:
        assert outcome.status == "ok" and outcome.fused > 0, (
            f"evonnx generated no kernel, so the test says nothing: {outcome.status} {outcome.note}")


# -- 1. model text reaching generated C ------------------------------------------------------------------------
def _named_model(text: str) -> onnx.ModelProto:
    """x[N,4] + y[M,4] through Add/Mul/Slice/Neg, with `text` in every tensor, node, initializer, dim_param,
    graph and doc string (M is the plain symbol: at N != M the kernel's size check reports names)."""
    def nm(tag: str) -> str:
        return f"{text}#{tag}"

    nodes = [
        node("Add", [nm("x"), nm("c")], [nm("a")]),
        node("Mul", [nm("a"), nm("y")], [nm("b")]),
        node("Slice", [nm("b"), nm("st"), nm("en"), nm("ax"), nm("sp")], [nm("s")]),
        node("Neg", [nm("s")], [nm("out")]),
    ]
    for k, nd in enumerate(nodes):
        nd.name = nm(f"node{k}")
        nd.doc_string = nm(f"doc{k}")
    nodes.insert(0, helper.make_node("Constant", [], [nm("c")], name=nm("const"),
                                     value=numpy_helper.from_array(np.arange(4, dtype=np.float32), nm("cv"))))
    nodes[0].attribute[0].doc_string = nm("attrdoc")
    model = make_model(nodes, [(nm("x"), F, [nm("N"), 4]), (nm("y"), F, ["M", 4])], [(nm("out"), F, 2)],
                   {nm("st"): np.array([1], np.int64), nm("en"): np.array([I64_MAX], np.int64),
                    nm("ax"): np.array([0], np.int64), nm("sp"): np.array([1], np.int64)}, name=nm("graph"))
    model.graph.doc_string = nm("gdoc")
    model.doc_string = nm("mdoc")
    model.graph.input[0].doc_string = nm("vdoc")
    for init in model.graph.initializer:
        init.doc_string = nm("idoc")
    helper.set_model_props(model, {nm("key"): nm("value")})
    return model


@pytest.mark.parametrize("template", [t for _, t, _ in TEMPLATES], ids=[name for name, _, _ in TEMPLATES])
def test_names_never_become_code(template: str, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    canary = Canary(marker=str(marker), tag="reg")
    text = payload(canary, template, 1)
    file_ok = next(ok for _, t, ok in TEMPLATES if t == template)
    file_name = (text[:150] + ".onnx") if file_ok else "model.opt.onnx"
    # (Slice start 1 on an empty N is the Slice test's business; here N >= 1, and N != M reaches the size check.)
    plans = [{text + "#N": n, "M": n} for n in (1, 3)] + [{text + "#N": 3, "M": 5}]
    _check(_named_model(text), plans, tmp_path, file_name=file_name, marker=marker)
    assert not marker.exists()


def _naive_string(text: str) -> str:
    """What an escaper that knows C's escapes but not trigraphs makes of `text`."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")


def test_names_check_flags_a_raw_injection() -> None:
    """The static check is not vacuous: each template that carries code, pasted into a comment, a line comment
    or a string or character literal, raw or through a naive escaper (`*/` broken up; quotes, backslashes and newlines
    escaped, trigraphs not), escapes in at least one of them, and the check reports it."""
    canary = Canary(marker="/nonexistent/marker", tag="self")
    for k, (name, template, _) in enumerate(TEMPLATES):
        text = payload(canary, template, k)
        if "{C}" not in template and "#define" not in template:
            continue
        contexts = [f"/* source nodes: {text} */\nint x;\n", f"// {text}\nint y;\n",
                    f'static const char *s = "{text}";\n',
                    f"/* source nodes: {text.replace('*/', '* /')} */\nint x;\n",
                    f'static const char *s = "{_naive_string(text)}";\n', f"static const char c = '{text}';\n"]
        assert any(escaped_identifiers(src) for src in contexts), name
    assert not escaped_identifiers("/* evo_canary_self_1 */ static const char *s = \"evo_canary_self_2\";\n")
    assert escaped_identifiers("/* a *??/\n/ int evo_canary_self_3; /* */\n")  # trigraph + splice end a comment
    assert escaped_identifiers('const char *s = "a??/\\"; int evo_canary_self_4; "";\n')


# -- 2 to 7: sizes, indices, constants ----------------------------------------------------------------------------
@pytest.mark.parametrize("key", [k for k in REGRESSIONS if not k.startswith("int-extremes/")])
def test_bug_class_regression(key: str, tmp_path: Path) -> None:
    reg = REGRESSIONS[key]()
    _check(reg.model, reg.plans, tmp_path, require_kernel=reg.require_kernel, regime=reg.regime)


@pytest.mark.parametrize("key", [k for k in REGRESSIONS if k.startswith("int-extremes/")])
def test_integer_extreme_constants(key: str, tmp_path: Path) -> None:
    reg = REGRESSIONS[key]()
    _check(reg.model, reg.plans, tmp_path, require_kernel=reg.require_kernel, regime=reg.regime)


def test_dead_node_errors_are_matched_by_full_name(tmp_path: Path) -> None:
    # adversarial node names hold quotes: onnxruntime's "Name:'a'b' Status Message:" must find node "a'b"
    from sec_excuses import _error_in_dead_node

    dead = node("Neg", ["x"], ["d"])
    dead.name = "a'); b"
    model = make_model([dead, node("Abs", ["x"], ["y"])], [("x", F, ["N"])], [("y", F, 1)], {})
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    err = "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Neg node. Name:'{}' Status " \
          "Message: boom"
    assert _error_in_dead_node({"model": str(path)}, err.format("a'); b"))
    assert not _error_in_dead_node({"model": str(path)}, err.format("Abs_y"))
    assert not _error_in_dead_node({"model": str(path)}, err.format("a'"))


def test_a_value_error_is_excused_only_in_a_node_whose_values_nobody_reads(tmp_path: Path) -> None:
    # Mod -> Shape -> output: only the Mod's shape is read. onnxruntime still runs it and fails on a zero divisor;
    # evonnx computes the shape at plan time (fuzz seed 150014). A shape error in that node is no such excuse, and
    # the same Mod read for its values is not excused at all.
    from sec_excuses import _error_in_dead_node

    i32 = TensorProto.INT32
    shape_only = make_model([node("Mod", ["a", "b"], ["m"]), node("Shape", ["m"], ["y"])],
                            [("a", i32, ["N"]), ("b", i32, ["N"])], [("y", TensorProto.INT64, 1)], {})
    read = make_model([node("Mod", ["a", "b"], ["m"]), node("Shape", ["m"], ["s"]), node("Neg", ["m"], ["y"])],
                      [("a", i32, ["N"]), ("b", i32, ["N"])], [("y", i32, 1), ("s", TensorProto.INT64, 1)], {})
    err = "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Mod node. Name:'Mod_m' " \
          "Status Message: element_wise_ops.cc:2256 operator() {}"
    for name, model in (("shape_only", shape_only), ("read", read)):
        onnx.save(model, str(tmp_path / f"{name}.onnx"))
    shape_only_run, read_run = ({"model": str(tmp_path / f"{n}.onnx")} for n in ("shape_only", "read"))
    assert _error_in_dead_node(shape_only_run, err.format("Integer modulo by zero"))
    assert not _error_in_dead_node(shape_only_run, err.format("Mod: left operand cannot broadcast"))
    assert not _error_in_dead_node(read_run, err.format("Integer modulo by zero"))


# -- fuzz findings whose class is fixed, replayed as found ------------------------------------------------------
REPLAYS = sorted((Path(__file__).resolve().parent / "replays").glob("*.onnx"))
# Replays whose right outcome is a clean refusal: onnxruntime runs the original at no generated input (a constant
# Gather index of INT32_MAX; a Gather of index 2 from a 1-element tensor), so there is nothing to check against.
# case001389 raised OverflowError at plan time (an int64 constant of 2**64 - 2 left unwrapped), fuzz seed 140034.
# case000229 (seed 170005): a Squeeze of an always-empty axis fails every run of the original, and the optimized
# model, its shapes made static, failed onnxruntime's load-time shape inference first; the check said so, not that.
# case000512 (seed 170011): onnxruntime cannot load the original (its node names); optimize had raised KeyError on
# the way (a two-axis reduction computed ahead on lanes).
# case000210 (seed 910004): onnxruntime's memory planner fails a float16 ReduceMean it runs itself in the optimized
# graph (a buffer re-used across an empty-input quirk shape); the check refuses that model.
# case000109 (seed 960002): a timeout (sizes of chained Slices nested to 6.5 MB of C); the original fails every
# generated input (a ScatterND index of INT64_MAX), so the refusal, in seconds, is the outcome.
# case000029 (seed 2, session 28): ONNX's shape inference aborts its process on the original (a Slice of a dim it
# inferred as -1), in onnxruntime's load as in evonnx's; evonnx now refuses it in one line instead of dying.
# case001954 (seed 21000045, the long run on 3aea3f4): a Tile of a [0, N] input under an ArgMax over its empty axis
# divided by 0 at plan time (the tile's index modulo the input's size 0); onnxruntime fails that ArgMax on every
# input, so the refusal is the outcome.
REFUSED_REPLAYS = {"case003193-6725a008", "case001389-21aa2b26", "case000229-2824b434", "case000512-8921c9d0",
                   "case000210-89b83296", "case000109-be84bdfd", "case000029-23a392b2", "case001954-a7f7e97e"}


@pytest.mark.parametrize("path", REPLAYS, ids=[p.stem for p in REPLAYS])
def test_fuzz_finding_replays(path: Path, tmp_path: Path) -> None:
    case = case_from_finding(path)
    outcome = check_case(case, tmp_path / "case", tmp_path / "no-marker",
                         env_extra={"EVONNX_SEC_PLANNER": finding_planner(path)})
    if outcome.findings:
        pytest.fail("\n".join([case.describe()] + outcome.findings), pytrace=False)
    if path.stem in REFUSED_REPLAYS:
        assert outcome.status == "refused", f"{outcome.status}: {outcome.note}"
        return
    assert outcome.status == "ok", f"{outcome.status}: {outcome.note}"
    assert outcome.runs_compared + outcome.runs_both_failed == len(case.plans), outcome.note


def _judge(tmp_path: Path, outs: dict[str, list[np.ndarray] | str]) -> list[str]:
    """`judge_runs` on hand-made results: label -> outputs, or an error text."""
    from sec_oracle import Outcome, judge_runs

    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    runs = []
    for label, value in outs.items():
        out = folder / label.replace("/", "")
        if isinstance(value, str):
            Path(str(out) + ".err").write_text(value)
        else:
            np.savez(str(out) + ".npz", *value)
        runs.append({"label": label, "model": "m.onnx", "out": str(out), "plan": "{N=2}"})
    outcome = Outcome()
    n_out = max((len(v) for v in outs.values() if not isinstance(v, str)), default=1)
    judge_runs([False] * n_out, runs, 0, "", [*outs, "done"], outcome)
    return outcome.findings


def test_second_look_references_excuse_only_what_they_reproduce(tmp_path: Path) -> None:
    from sec_excuses import REUSE_ERROR

    ort, evo = np.array([True, False]), np.array([True, True])
    # a comparison that flips: excused when onnxruntime, fed evonnx's inexact values, flips it too
    assert _judge(tmp_path, {"original/0": [ort], "optimized/0": [evo], "cutref/0": [evo]}) == []
    assert _judge(tmp_path, {"original/0": [ort], "optimized/0": [evo], "cutref/0": [ort]})
    assert _judge(tmp_path, {"original/0": [ort], "optimized/0": [evo]})
    # onnxruntime's buffer re-use failure: excused only when its result with re-use off is evonnx's
    failed = f"Fail: [ONNXRuntimeError] : 1 : FAIL : {REUSE_ERROR}. {{0}} != {{1}}."
    assert _judge(tmp_path, {"original/0": failed, "optimized/0": [evo], "noreuse/0": [evo]}) == []
    assert _judge(tmp_path, {"original/0": failed, "optimized/0": [evo], "noreuse/0": [ort]})
    assert _judge(tmp_path, {"original/0": "Fail: another error", "optimized/0": [evo], "noreuse/0": [evo]})


def test_out_of_memory_after_the_original_is_run_again_alone(tmp_path: Path) -> None:
    """Fuzz case 2291: the child runs the original's sessions first under its address cap, their arenas keep what
    they took, and the optimized model's session can then fail to allocate. The run is judged by its repeat in a
    child of its own (`alone/k`, _second_look); without one, or where the repeat fails too, it is a finding."""
    oom = "Fail: [ONNXRuntimeError] : 1 : FAIL : bfc_arena.cc:360 void* onnxruntime::BFCArena::AllocateRawInternal"
    ort = np.array([1.0, 2.0], np.float32)
    assert _judge(tmp_path, {"original/0": [ort], "optimized/0": oom, "alone/0": [ort]}) == []
    assert _judge(tmp_path, {"original/0": [ort], "optimized/0": oom, "alone/0": [ort + 1]})
    assert _judge(tmp_path, {"original/0": [ort], "optimized/0": oom, "alone/0": oom})
    assert _judge(tmp_path, {"original/0": [ort], "optimized/0": oom})


# -- the oracle itself ------------------------------------------------------------------------------------------
def test_oracle_asks_again_with_the_worker_when_onnxruntime_crashes(tmp_path: Path) -> None:
    """The optimize child runs without evonnx's worker process (one Python start-up less per case). onnxruntime
    dies on this model (INT64_MIN / -1 traps), which kills that child; the oracle then asks again as a user's
    process runs, with the worker, and evonnx refuses cleanly: no finding."""
    model = make_model([node("Div", ["a", "b"], ["q"]), node("Add", ["x", "q"], ["s"]), node("Mul", ["s", "s"], ["y"])],
                       [("x", TensorProto.INT64, ["N", 2])], [("y", TensorProto.INT64, 2)],
                       {"a": np.array([np.iinfo(np.int64).min, 4], np.int64), "b": np.array([-1, 2], np.int64)})
    case = case_from_model(model, [{"N": 2}])
    outcome = check_case(case, tmp_path / "case", tmp_path / "no-marker")
    assert outcome.findings == []
    assert outcome.status == "refused" and "crashed (SIGFPE)" in outcome.note, f"{outcome.status}: {outcome.note}"


@pytest.mark.parametrize(("kind", "message", "finding"), [
    ("VerificationError", "onnxruntime crashed (SIGSEGV) while running the optimized model (sizes N=3)", True),
    ("OutputMismatch", "output 'y' must match exactly but differs at 3 positions", True),
    ("KernelFailure", "kernel 'k0' failed its check of node 'g' (Gather) at sizes N=0", True),
    ("UnloadableModel", "onnxruntime cannot load the optimized model: bad type", True),
    ("VerificationError", "cannot check: onnxruntime rejects every generated input for the original model", False),
    ("UnsupportedError", "node 'n' (If) is not handled", False),
])
def test_oracle_counts_a_refusal_by_evonnxs_own_check_as_a_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   kind: str, message: str, finding: bool) -> None:
    """A model that evonnx's check refuses was never written, but the kernels or the plan have a bug that the
    check's sizes happened to catch: the fuzzer reports it, whichever subclass of VerificationError the check
    raised (the oracle once matched the base class's name only, and OutputMismatch passed as a clean refusal). A
    model that onnxruntime cannot run, or an op evonnx does not handle, is no finding."""
    import json

    import sec_oracle

    from evonnx import errors

    error = getattr(errors, kind)(message)

    def fake_child(args: Sequence[str], cwd: Path, timeout: float, env: object) -> tuple[int, str]:
        # what sec_child writes for a refusal
        Path(args[4]).write_text(json.dumps({"status": "refused", "type": type(error).__name__, "message": str(error),
                                             "kinds": [c.__name__ for c in type(error).__mro__]}))
        return 0, ""

    monkeypatch.setattr(sec_oracle, "_run_child", fake_child)
    outcome = sec_oracle.Outcome()
    sec_oracle.optimize_case(tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "d", tmp_path, {}, outcome)
    assert bool(outcome.findings) == finding, outcome.findings
    assert finding or outcome.note.startswith(f"refused: {kind}: ")
