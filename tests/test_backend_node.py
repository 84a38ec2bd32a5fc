"""Conformance: the ONNX package's backend node tests, optimized by evonnx, reproduce the expected outputs.

`onnx.backend.test.case.node.collect_testcases("")` builds every case in-process (model, inputs, expected
outputs). A case is used when every op is one evonnx lowers and every tensor type is one it supports. Cases at
opsets newer than the installed onnxruntime runs (`evonnx.model.opset_max`, 26 for onnxruntime 1.31; the onnx
package writes up to 28) are relabelled to that opset when they pass the checker there, and count only when
onnxruntime still reproduces the expected outputs on the relabelled model. The harness then
- freezes the plan-time inputs (Reshape's shape, Slice's starts, Gather's indices, ...) to the case's values,
  as real models have them, so that the op can be fused at all;
- gives every graph output a fusible neighbour that keeps the value exactly (`Add(y, 0)`, `Or(y, false)`
  for bool, `Where(true, y, y)` where Add-13 lacks the type): a lone op is never fused, so without it the
  case would not exercise evonnx;
- batches the cases of one (op types, opset) into one model and one kernel library (a compile costs about
  0.2 s), runs `evonnx.optimize(check=True)` on it, and compares each case's outputs with its expected ones
  (onnxruntime's where onnxruntime itself departs from the ONNX reference: evonnx follows onnxruntime).
When a batch fails to optimize, each of its cases is optimized alone, so the failure lands on the right case.

Skipped with the reason: cases evonnx fuses nothing of, cases onnxruntime cannot run, and those the harness
cannot apply (float16/bfloat16/float8/int4/string tensors, sequences and optionals).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import evonnx
from evonnx.model import OPSET_MIN, ir_version_for, opset_max
from evonnx.passes.lower_ops import LOWER, VALUE_INPUTS

pytestmark = pytest.mark.compiler

OPSET_RANGE = range(OPSET_MIN, opset_max() + 1)
RELABEL_OPSET = opset_max()
SUPPORTED_TYPES = {
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.INT8, onnx.TensorProto.INT16,
    onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT32, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL,
}
# Add-13 lacks these types (Add-14 added them): their outputs get `Where(true, y, y)` instead.
ADD13_MISSING = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16}
HANDLED_OPS = set(LOWER) | {"Constant"}
# The data input of these is read for its shape only; freezing it would fold the whole case away.
SHAPE_ONLY_SLOTS = {"Shape": (0,), "Size": (0,)}


def _opset(model: onnx.ModelProto) -> int:
    return next(int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _elem_type(vi: onnx.ValueInfoProto) -> int | None:
    return vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else None


def _relabelled(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model with its default-domain opset set to 21, when it passes the checker there, else None.

    Most cases exist only at opsets 22..28 (Reshape, Transpose, Squeeze, Cast, ...), whose definitions added
    element types to the opset-21 ones. A relabelled case counts only when onnxruntime still reproduces the
    expected outputs on it (checked in the test), so a changed semantics cannot pass as an evonnx bug.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = RELABEL_OPSET
    out.ir_version = min(out.ir_version, ir_version_for(RELABEL_OPSET)) if _opset(model) > RELABEL_OPSET \
        else max(out.ir_version, 7)
    try:
        onnx.checker.check_model(out, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return None
    return out


def _model(case: object) -> onnx.ModelProto:
    """The case's model at an opset evonnx supports (see `_relabelled`)."""
    model: onnx.ModelProto = case.model  # type: ignore[attr-defined]
    if _opset(model) in OPSET_RANGE:
        if model.ir_version >= 7:
            return model
        out = onnx.ModelProto()  # IR 3 (the oldest cases) lists every initializer among the inputs; the harness
        out.CopyFrom(model)  # adds initializers of its own
        out.ir_version = 7
        return out
    out = _relabelled(model)
    assert out is not None
    return out


def _why_not_applicable(case: object) -> str | None:
    """The reason the harness cannot apply `case`, or None."""
    model: onnx.ModelProto = case.model  # type: ignore[attr-defined]
    g = model.graph
    if g.initializer:
        return "inputs that are initializers"
    if len(case.data_sets) != 1:  # type: ignore[attr-defined]
        return "more than one data set"
    for vi in list(g.input) + list(g.output):
        t = _elem_type(vi)
        if t is None:
            return f"'{vi.name}' is not a tensor (sequence/optional/map)"
        if t not in SUPPORTED_TYPES:
            return f"'{vi.name}' has element type {onnx.TensorProto.DataType.Name(t)}"
    if _opset(model) not in OPSET_RANGE and _relabelled(model) is None:
        return (f"opset {_opset(model)} is outside {OPSET_MIN}..{opset_max()} and the model is not valid at opset "
                f"{RELABEL_OPSET}")
    if any(n.domain not in ("", "ai.onnx") for n in g.node):
        return "a node outside the default domain"
    return None


def _collect() -> list[object]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = collect_testcases("")
    return [c for c in cases if c.model.graph.node and all(n.op_type in HANDLED_OPS for n in c.model.graph.node)]


CASES = {c.name: c for c in _collect()}  # type: ignore[attr-defined]
APPLICABLE = {name: c for name, c in CASES.items() if _why_not_applicable(c) is None}
MODELS = {name: _model(c) for name, c in APPLICABLE.items()}


# -- making the model that is optimized ----------------------------------------------------------------------
def _prepare(name: str, prefix: str, freeze: bool) -> tuple[onnx.GraphProto, dict[str, np.ndarray],
                                                            dict[str, np.ndarray]]:
    """The case's graph with value inputs frozen (with `freeze`), a neighbour on every output, every name
    prefixed; its feeds and expected outputs by (prefixed) name."""
    model = MODELS[name]
    inputs, outputs = _case_data(name)
    g = onnx.GraphProto()
    g.CopyFrom(model.graph)
    values = {vi.name: v for vi, v in zip(g.input, inputs, strict=True)}
    frozen: set[str] = set()
    for n in g.node if freeze else ():
        skip = SHAPE_ONLY_SLOTS.get(n.op_type, ())
        for k in VALUE_INPUTS.get(n.op_type, ()):
            if k < len(n.input) and n.input[k] in values and k not in skip:
                frozen.add(n.input[k])
    for t in sorted(frozen):
        g.initializer.append(numpy_helper.from_array(values[t], t))
    kept = [vi for vi in g.input if vi.name not in frozen]
    del g.input[:]
    g.input.extend(kept)

    opset = _opset(model)
    for k, out in enumerate(g.output):
        raw = f"{out.name}__raw"
        for n in g.node:
            n.output[:] = [raw if o == out.name else o for o in n.output]
        t = out.type.tensor_type.elem_type
        if t == onnx.TensorProto.BOOL:
            g.initializer.append(numpy_helper.from_array(np.array(False), f"{out.name}__false"))
            g.node.append(helper.make_node("Or", [raw, f"{out.name}__false"], [out.name], name=f"neighbour{k}"))
        elif opset < 14 and t in ADD13_MISSING:
            g.initializer.append(numpy_helper.from_array(np.array(True), f"{out.name}__true"))
            g.node.append(helper.make_node("Where", [f"{out.name}__true", raw, raw], [out.name], name=f"neighbour{k}"))
        else:
            zero = np.zeros((), dtype=helper.tensor_dtype_to_np_dtype(t))
            g.initializer.append(numpy_helper.from_array(zero, f"{out.name}__zero"))
            g.node.append(helper.make_node("Add", [raw, f"{out.name}__zero"], [out.name], name=f"neighbour{k}"))
    for k, n in enumerate(g.node):
        if not n.name:
            n.name = f"node{k}"

    tmp = helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    g = onnx.compose.add_prefix(tmp, prefix).graph
    feeds = {prefix + vi.name: values[vi.name] for vi in kept}
    expected = {prefix + vi.name: v for vi, v in zip(model.graph.output, outputs, strict=True)}
    return g, feeds, expected


@dataclass
class Batch:
    """One optimized model holding several cases."""

    names: tuple[str, ...]
    path: Path | None = None
    result: evonnx.OptimizeResult | None = None
    error: BaseException | None = None
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    expected: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # case -> output -> value
    outputs: dict[str, np.ndarray] | None = None
    prefix: dict[str, str] = field(default_factory=dict)


def _build(names: Sequence[str], folder: Path, freeze: bool = True) -> Batch:
    """The cases `names` in one model, optimized. Frozen, the check also runs the cases' own inputs
    (`--inputs`); as written, only the inputs it synthesizes, which must run."""
    batch = Batch(tuple(names))
    graph = onnx.GraphProto(name="cases")
    opsets: dict[str, int] = {}
    ir = 3
    for k, name in enumerate(names):
        prefix = f"c{k}_"
        g, feeds, expected = _prepare(name, prefix, freeze)
        for f in ("node", "initializer", "input", "output", "value_info"):
            getattr(graph, f).extend(getattr(g, f))
        batch.feeds.update(feeds)
        batch.expected[name] = expected
        batch.prefix[name] = prefix
        for o in MODELS[name].opset_import:
            opsets[o.domain] = max(opsets.get(o.domain, 0), int(o.version))
        ir = max(ir, MODELS[name].ir_version)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())],
                              ir_version=ir)
    src = folder / "cases.onnx"
    onnx.save(model, src)
    dst = folder / "cases.opt.onnx"
    data = folder / "inputs.npz"
    np.savez(data, **batch.feeds)
    try:
        batch.result = evonnx.optimize(src, dst, check=True, inputs=data if freeze else None)
    except Exception as e:  # noqa: BLE001 - any failure is attributed to a case by optimizing it alone
        batch.error = e
        return batch
    batch.path = dst
    return batch


_BATCHES: dict[tuple, Batch] = {}
_SINGLES: dict[tuple[str, bool], Batch] = {}


def _batch_key(name: str) -> tuple:
    model = MODELS[name]
    return (tuple(sorted({n.op_type for n in model.graph.node})), _opset(model))


def _usable(name: str) -> str | None:
    """Why onnxruntime cannot serve as the oracle of this case, or None."""
    refs = _onnxruntime_outputs(name)
    if isinstance(refs, str):
        return f"onnxruntime cannot run the case: {refs}"
    if _opset(CASES[name].model) not in OPSET_RANGE:  # type: ignore[attr-defined]
        try:
            for ref, want in zip(refs, _case_data(name)[1], strict=True):
                _assert_matches(ref, want, "onnxruntime")
        except AssertionError:
            return f"relabelled to opset {RELABEL_OPSET}, onnxruntime no longer gives the expected outputs"
    return None


def _batch_for(name: str, tmp_path_factory: pytest.TempPathFactory, freeze: bool = True) -> Batch:
    key = (*_batch_key(name), freeze)
    if key not in _BATCHES:
        members = sorted(n for n in APPLICABLE if (*_batch_key(n), freeze) == key and _usable(n) is None)
        _BATCHES[key] = _build(members, tmp_path_factory.mktemp("batch"), freeze)
    batch = _BATCHES[key]
    if batch.error is None:
        return batch
    if (name, freeze) not in _SINGLES:
        _SINGLES[name, freeze] = _build([name], tmp_path_factory.mktemp("single"), freeze)
    return _SINGLES[name, freeze]


def _run(batch: Batch) -> dict[str, np.ndarray]:
    if batch.outputs is None:
        assert batch.path is not None
        sess = evonnx.load_session(batch.path)
        names = [o.name for o in sess.get_outputs()]
        batch.outputs = dict(zip(names, sess.run(None, batch.feeds), strict=True))
    return batch.outputs


def _assert_matches(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def _case_data(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The case's inputs and expected outputs as arrays (some cases hold TensorProtos or numpy scalars)."""
    def arr(v: object) -> np.ndarray:
        return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)

    inputs, outputs = CASES[name].data_sets[0]  # type: ignore[attr-defined]
    return [arr(v) for v in inputs], [arr(v) for v in outputs]


_ORACLE: dict[str, list[np.ndarray] | str] = {}


def _onnxruntime_outputs(name: str) -> list[np.ndarray] | str:
    """onnxruntime on the case's (possibly relabelled) model, without the harness's changes; or why it fails."""
    if name not in _ORACLE:
        model = MODELS[name]
        so = ort.SessionOptions()
        so.log_severity_level = 4
        inputs, _ = _case_data(name)
        try:
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            _ORACLE[name] = [np.asarray(v) for v in sess.run(None, {vi.name: v for vi, v in
                                                                    zip(model.graph.input, inputs, strict=True)})]
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types
            _ORACLE[name] = str(e).split("]")[-1].strip().splitlines()[0][:120]
    return _ORACLE[name]


def _check_case(name: str, tmp_path_factory: pytest.TempPathFactory, freeze: bool) -> None:
    why = _why_not_applicable(CASES[name])
    if why is not None:
        pytest.skip(f"harness cannot apply: {why}")
    why = _usable(name)
    if why is not None:
        pytest.skip(why)
    batch = _batch_for(name, tmp_path_factory, freeze)
    if batch.error is not None:
        raise batch.error
    assert batch.result is not None
    prefix = batch.prefix[name]
    case_nodes = {prefix + (n.name or f"node{k}") for k, n in enumerate(MODELS[name].graph.node)}
    fused = case_nodes & {n for k in batch.result.kernels for n in k.source_nodes}
    if not fused:
        reasons = {f"{r.op}: {r.reason}" for r in batch.result.plan.rejected if r.node in case_nodes}
        if case_nodes & set(batch.result.folded):
            reasons.add("onnxruntime folds its nodes at session start (every input they read is a constant)")
        pytest.skip(f"evonnx fuses nothing of this case ({'; '.join(sorted(reasons))[:300] or 'no reason'})")
    outputs = _run(batch)
    expected = batch.expected[name]
    try:
        for out, want in expected.items():
            _assert_matches(np.asarray(outputs[out]), want, out)
    except AssertionError:
        # When onnxruntime itself disagrees with the ONNX reference, onnxruntime is the oracle evonnx follows.
        refs = _onnxruntime_outputs(name)
        assert not isinstance(refs, str)
        ort_agrees = True
        try:
            for ref, want in zip(refs, expected.values(), strict=True):
                _assert_matches(ref, want, "onnxruntime")
        except AssertionError:
            ort_agrees = False
        if ort_agrees:
            raise
        for (out, _), ref in zip(expected.items(), refs, strict=True):
            _assert_matches(np.asarray(outputs[out]), ref, f"{out} vs onnxruntime")


@pytest.mark.parametrize("name", sorted(CASES))
def test_backend_node_case_matches_expected(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Value inputs frozen to the case's values (as real models have them); the check runs the case's inputs."""
    _check_case(name, tmp_path_factory, freeze=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_backend_node_case_as_written(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every input stays an input (indices, Slice bounds, shapes, ...), and the check has only the inputs it
    synthesizes from their consumers: it must never answer "cannot check"."""
    _check_case(name, tmp_path_factory, freeze=False)


def test_backend_node_harness_exercises_evonnx() -> None:
    """The filter keeps a real share of the ONNX cases: a change that drops them all must not pass silently."""
    assert len(APPLICABLE) >= 150
    assert {"Slice", "Gather", "Transpose", "Reshape", "Concat", "Expand"} <= {
        n.op_type for m in MODELS.values() for n in m.graph.node}


def test_backend_node_neighbour_is_fused(tmp_path: Path) -> None:
    """The neighbour makes a single op fusible: Transpose + Add becomes one kernel absorbing both."""
    batch = _build(["test_transpose_default"], tmp_path)
    assert batch.error is None and batch.result is not None
    assert [sorted(k.source_ops) for k in batch.result.kernels] == [["Add", "Transpose"]]
