"""The check that guards every write: onnxruntime on the original vs onnxruntime on the optimized model.

Inputs are seeded and non-trivial. Symbolic dims are tried at several sizes (at least two when the model has
any, so that a frozen sample size cannot pass). Outputs computed only by exact operations must match exactly
(NaN == NaN, -0.0 == 0.0); others within per-dtype tolerances.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from evonnx.errors import VerificationError

RTOL = {"float32": 1e-4, "float64": 1e-9}
ATOL_SCALE = {"float32": 1e-5, "float64": 1e-12}
SIZE_CANDIDATES = (3, 5, 64, 256, 1024)
# Elements of one generated input: real post-processing inputs have a few million (1x25200x85, 1x3x1333x800);
# 2**26 float64 draws take 512 MiB. Larger declared sizes are refused rather than allocated.
MAX_INPUT_ELEMENTS = 1 << 26
# Elements of any tensor whose shape is known before running: the check refuses rather than asks onnxruntime for
# terabytes (a declared dim of 2**40, a `Range(0, 2**40)`).
MAX_TENSOR_ELEMENTS = 1 << 28


@dataclass
class CheckResult:
    runs: list[dict[str, int]] = field(default_factory=list)  # symbol sizes of each run
    compared: int = 0  # output tensors compared
    exact: int = 0  # of which required to match exactly
    max_rel_err: float = 0.0

    def __str__(self) -> str:
        distinct = list(dict.fromkeys(",".join(f"{k}={v}" for k, v in r.items()) or "static sizes" for r in self.runs))
        return (f"passed: {self.compared} outputs over {len(self.runs)} runs ({'; '.join(distinct)}; "
                f"{len(REGIMES)} value regimes), {self.exact} exact, max relative error {self.max_rel_err:.2g}")


def _symbols(model: onnx.ModelProto) -> list[str]:
    out: list[str] = []
    for i in model.graph.input:
        for k, d in enumerate(i.type.tensor_type.shape.dim):
            name = d.dim_param if d.HasField("dim_param") else ("" if d.HasField("dim_value") else f"{i.name}:{k}")
            if name and name not in out:
                out.append(name)
    return out


# Value regimes each check runs: small values (signs, exp() stays finite), then large ones (image-sized boxes
# and thresholds, wide integer ranges), so that comparisons and clamps take both branches in one of them.
REGIMES = ({"float_scale": 2.0, "int_high": 8}, {"float_scale": 400.0, "int_high": 2000})


def make_inputs(model: onnx.ModelProto, sizes: Mapping[str, int], seed: int,
                shapes: Mapping[str, Sequence[int]] | None = None, regime: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    scale, high = REGIMES[regime]["float_scale"], REGIMES[regime]["int_high"]
    init = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for i in model.graph.input:
        if i.name in init:
            continue
        tt = i.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = _input_shape(i, sizes, shapes)
        if np.issubdtype(dtype, np.floating):
            arr = (rng.standard_normal(shape) * scale).astype(dtype)
        elif dtype == np.bool_:
            arr = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            top = min(int(high), int(np.iinfo(dtype).max))
            arr = rng.integers(0, top, size=tuple(shape)).astype(dtype)
        else:  # strings: evonnx never fuses them; the check only has to feed something onnxruntime accepts
            arr = np.array([f"s{v}" for v in rng.integers(0, 1000, size=int(np.prod(shape)))],
                           dtype=object).reshape(shape)
        # a rank-0 input is a 0-d array (numpy's scalars are refused by onnxruntime)
        feeds[i.name] = np.asarray(arr, dtype=dtype)
    return feeds


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _check_static_sizes(model: onnx.ModelProto) -> None:
    g = model.graph
    for vi in (*g.input, *g.output, *g.value_info):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        if all(d.HasField("dim_value") for d in tt.shape.dim):
            shape = [d.dim_value for d in tt.shape.dim]
            if math.prod(shape) > MAX_TENSOR_ELEMENTS:
                raise VerificationError(f"cannot check: tensor '{vi.name}' of shape {shape} has {math.prod(shape)} "
                                        f"elements, more than the check runs ({MAX_TENSOR_ELEMENTS}); skip the "
                                        f"check with --no-check")


def check_sizes(model: onnx.ModelProto, sizes: Mapping[str, int] | None = None,
                shapes: Mapping[str, Sequence[int]] | None = None) -> None:
    """Refuse a check that would ask for terabytes, before any work: a tensor whose shape is known above
    MAX_TENSOR_ELEMENTS, an input at the named sizes above MAX_INPUT_ELEMENTS, a negative size."""
    _check_static_sizes(model)
    base = {**{s: 3 for s in _symbols(model)}, **(sizes or {})}
    init = {t.name for t in model.graph.initializer}
    for i in model.graph.input:
        if i.name not in init:
            _input_shape(i, base, shapes)


def _input_shape(i: onnx.ValueInfoProto, sizes: Mapping[str, int], shapes: Mapping[str, Sequence[int]] | None
                 ) -> list[int]:
    if shapes and i.name in shapes:
        shape = [int(n) for n in shapes[i.name]]
    else:
        shape = []
        for k, d in enumerate(i.type.tensor_type.shape.dim):
            key = d.dim_param if d.HasField("dim_param") else f"{i.name}:{k}"
            shape.append(d.dim_value if d.HasField("dim_value") else int(sizes[key]))
    _check_input_shape(i.name, shape)
    return shape


def _check_input_shape(name: str, shape: Sequence[int]) -> None:
    if any(n < 0 for n in shape):
        raise VerificationError(f"cannot check: input '{name}' would get the negative shape {list(shape)}; "
                                f"name sizes >= 0 with --dim or --input-shape")
    count = math.prod(shape)
    if count > MAX_INPUT_ELEMENTS:
        raise VerificationError(f"cannot check: input '{name}' of shape {list(shape)} has {count} elements, more "
                                f"than the check generates ({MAX_INPUT_ELEMENTS}); name smaller sizes with --dim or "
                                f"--input-shape, or skip the check with --no-check")


def _compare(name: str, ref: np.ndarray, got: np.ndarray, exact: bool, result: CheckResult) -> None:
    if ref.shape != got.shape or ref.dtype != got.dtype:
        raise VerificationError(f"output '{name}': optimized gives {got.dtype}{list(got.shape)}, "
                                f"original {ref.dtype}{list(ref.shape)}")
    result.compared += 1
    if exact or ref.dtype.kind not in "fc":
        result.exact += 1
        same = np.array_equal(ref, got, equal_nan=ref.dtype.kind in "fc")
        if not same:
            bad = np.argwhere(~((ref == got) | (np.isnan(ref) & np.isnan(got)) if ref.dtype.kind in "fc"
                                else ref == got))
            first = tuple(int(x) for x in bad[0]) if bad.size else ()
            raise VerificationError(f"output '{name}' must match exactly but differs at {len(bad)} positions, "
                                    f"first {list(first)}: optimized {got[first]!r}, original {ref[first]!r}")
        return
    key = str(ref.dtype)
    finite = np.isfinite(ref)
    scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 1.0
    atol = ATOL_SCALE.get(key, 1e-3) * max(1.0, scale)
    rtol = RTOL.get(key, 1e-3)
    ok = np.isclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)
    if not ok.all():
        bad = np.argwhere(~ok)
        first = tuple(int(x) for x in bad[0])
        raise VerificationError(f"output '{name}' differs beyond tolerance (rtol {rtol}, atol {atol:.3g}) at "
                                f"{len(bad)} positions, first {list(first)}: optimized {got[first]!r}, "
                                f"original {ref[first]!r}")
    with np.errstate(all="ignore"):
        rel = np.abs(got[finite].astype(np.float64) - ref[finite]) / np.maximum(np.abs(ref[finite]), 1e-30)
    if rel.size:
        result.max_rel_err = max(result.max_rel_err, float(np.nanmax(np.where(np.abs(ref[finite]) > atol, rel, 0))))


def check_models(original: onnx.ModelProto, optimized: Path, library: Path, exact_outputs: set[str], *,
                 sizes: Mapping[str, int] | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
                 seed: int = 0) -> CheckResult:
    """Run both models and compare; raises VerificationError on a mismatch or when no input set runs."""
    import onnxruntime as ort

    check_sizes(original, sizes, shapes)
    so = ort.SessionOptions()
    so.log_severity_level = 4  # failures become VerificationErrors; onnxruntime prints nothing
    try:
        ref_sess = ort.InferenceSession(original.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types; report any of them
        raise VerificationError(f"cannot check: onnxruntime cannot load the original model "
                                f"({_first_line(e)})") from e
    so2 = ort.SessionOptions()
    so2.log_severity_level = 4
    try:
        # dlopen searches its library path, not the current folder, for a name without a slash.
        so2.register_custom_ops_library(str(Path(library).absolute()))
        opt_sess = ort.InferenceSession(str(optimized), so2, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types; report any of them
        raise VerificationError(f"onnxruntime cannot load the optimized model: {_first_line(e)}") from e
    symbols = _symbols(original)
    plans: list[dict[str, int]] = []
    if sizes or shapes or not symbols:
        plans.append(dict(sizes or {}))
    wanted = 1 if plans else 2
    result = CheckResult()
    last_error = ""
    sized = 0
    for cand in ([None] if plans else SIZE_CANDIDATES):
        run_sizes = plans[0] if cand is None else {s: cand for s in symbols}
        ran = False
        for regime in range(len(REGIMES)):
            feeds = make_inputs(original, {**{s: 3 for s in symbols}, **run_sizes}, seed + len(result.runs), shapes,
                                regime)
            try:
                refs = ref_sess.run(None, feeds)
            except Exception as e:  # noqa: BLE001 - the original rejects these inputs: try other ones
                last_error = _first_line(e)
                continue
            try:
                gots = opt_sess.run(None, feeds)
            except Exception as e:  # noqa: BLE001
                raise VerificationError(f"the optimized model fails where the original runs "
                                        f"(sizes {run_sizes}): {_first_line(e)}") from e
            for out, ref, got in zip(original.graph.output, refs, gots):
                _compare(out.name, np.asarray(ref), np.asarray(got), out.name in exact_outputs, result)
            result.runs.append(run_sizes)
            ran = True
        sized += ran
        if sized >= wanted:
            break
    if not result.runs:
        raise VerificationError(f"cannot check: onnxruntime rejects every generated input for the original model "
                                f"({last_error}); name input sizes with --dim or --input-shape")
    return result
