"""The check that guards every write: onnxruntime on the original vs onnxruntime on the optimized model.

Inputs are synthesized from what each input's consumers accept (`evonnx.inputs`), in three value regimes, plus
the user's own (`--inputs`). Symbolic dims get distinct sizes (`evonnx.sizes`): the symbols the plan ties together
(broadcast checks) share one, every other class of them its own prime, so a kernel that mixes up two sizes fails.
Outputs computed only by exact operations must match exactly (NaN == NaN), zero signs included unless a Min, a Max
or a max/min reduction computes them (`ZERO_SIGN_UNDEFINED`); others within per-dtype tolerances. A difference
passes only where onnxruntime's own result is the one in doubt: a decision at its rounding threshold, a large
integer's float32 rounding, a float32 sum further from float64 than evonnx's, a NaN rule that depends on the SIMD
lane (`evonnx.references`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from evonnx.blame import first_differing_kernel
from evonnx.errors import KernelFailure, NodeFailure, OutputMismatch, UnloadableModel, VariantError, VerificationError
from evonnx.excuses import REUSE_ERROR, decided_as_in_float64, flipped_decisions, from_empty_concat, near_ties
from evonnx.inputs import REGIMES, AmbiguousInputs
from evonnx.isolate import CrashError, doing, isolated, register_library
from evonnx.model import ZERO_SIGN_UNDEFINED, half_precision_outputs, outputs_untouched_by
from evonnx.passes.lower_groups import THRESHOLDS
from evonnx.references import as_float64, first_nan_reference
from evonnx.sizes import check_sizes, input_symbols, make_inputs, run_size_plans
from evonnx.toolchain import cpu_runs_v3

# float16: each op rounds to 11 bits (an ulp is 2^-10 relative at worst), and a kernel's float32 transcendental
# may round to the neighbouring float16 where onnxruntime's does not, a difference later ops carry along
RTOL = {"float16": 4e-3, "float32": 1e-4, "float64": 1e-9}
HALF_OVERFLOW = 65520.0  # the least magnitude that rounds to an infinity in float16
ATOL_SCALE = {"float16": 1e-3, "float32": 1e-5, "float64": 1e-12}


@dataclass
class CheckResult:
    runs: list[dict[str, int]] = field(default_factory=list)  # symbol sizes of each run
    compared: int = 0  # output tensors compared
    exact: int = 0  # of which required to match exactly
    max_rel_err: float = 0.0
    user_sets: int = 0  # --inputs sets run
    skipped: list[str] = field(default_factory=list)  # size plans onnxruntime did not run on the original
    flips: int = 0  # integer/bool elements of inexact kernels decided the other way at a rounding threshold
    # float elements where onnxruntime's own rounding (a long sum in its order) is off the float64 value by more
    # than the tolerance, and evonnx's value is at least as close to it
    closer: int = 0
    # outputs that differ where a float ReduceMax/ReduceMin row holds a NaN, and match onnxruntime on the original
    # with one NaN rule for every SIMD lane (`references.first_nan_reference`)
    nan_lanes: int = 0
    # the variants of the CPU kernels every run compared (prelude.c, EVO_PICK): x86-64-v3 and baseline where this
    # machine runs both, else the one it runs
    variants: tuple[str, ...] = ()
    # output elements computed from a Concat of empty inputs that onnxruntime fills from memory (_undefined_...)
    undefined: int = 0
    # input sets whose outputs match once the TopKs and the comparisons against a threshold take the optimized
    # model's near-tie choices (_topk_near_ties)
    topk_ties: int = 0
    # where the x86-64-v3 kernels differed and the baseline ones matched (errors.VariantError): what differed
    variant_bug: str = ""

    def __str__(self) -> str:
        distinct = list(dict.fromkeys(",".join(f"{k}={v}" for k, v in r.items()) or "static sizes" for r in self.runs))
        user = f", {self.user_sets} input sets of yours" if self.user_sets else ""
        flips = f", {self.flips} decisions flipped by rounding at their threshold" if self.flips else ""
        flips += (f", {self.closer} values where onnxruntime's float32 rounding is further from the float64 "
                  f"result than evonnx's" if self.closer else "")
        flips += (f", {self.nan_lanes} outputs that match the original only once its max/min reductions treat NaN "
                  f"alike in every SIMD lane" if self.nan_lanes else "")
        flips += (f", {self.topk_ties} input sets whose TopK orders, or threshold decides, near ties otherwise"
                  if self.topk_ties else "")
        flips += (f", {self.undefined} values onnxruntime reads from memory it never wrote (a Concat of empty "
                  f"inputs)" if self.undefined else "")
        skipped = f"; skipped {'; '.join(self.skipped)[:240]}" if self.skipped else ""
        both = f"; each with the {' and the '.join(self.variants)} CPU kernels" if len(self.variants) > 1 else ""
        if self.variant_bug:
            skipped += (f"; the library has the baseline CPU kernels only: the x86-64-v3 ones differ from onnxruntime "
                        f"where the baseline ones match, a compiler bug ({self.variant_bug[:160]})")
        return (f"passed: {self.compared} outputs over {len(self.runs)} runs ({'; '.join(distinct)}; "
                f"{len(REGIMES)} value regimes{user}{both}), {self.exact} exact, max relative error "
                f"{self.max_rel_err:.2g}{flips}{skipped}")


# A Fused node's own check of a node's sizes or indices, one that onnxruntime's kernel for the node makes too
# (codegen_c's guards): the Fused node's name is evonnx's (evo<n>_<hash>), never a model's
_KERNEL_CHECK = re.compile(r"Fused node\. Name:'(evo[0-9]+_[0-9a-f]+)'.*\(onnxruntime fails this node too\)", re.S)


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def signed_zero_outputs(model: onnx.ModelProto) -> set[str]:
    """Graph outputs of `model` that no op in ZERO_SIGN_UNDEFINED computes: exact ones match zero signs too."""
    # a subgraph's ops are not walked: a control-flow node counts as possibly Min or Max
    return outputs_untouched_by(model, lambda n: n.op_type in ZERO_SIGN_UNDEFINED
                                or n.op_type in ("If", "Loop", "Scan"))


def _compare(name: str, ref: np.ndarray, got: np.ndarray, exact: bool, result: CheckResult,
             signs: bool = True, tolerance: str | None = None) -> None:
    """Raises VerificationError when `got` differs from onnxruntime's `ref`: bit for bit where `exact` (NaN == NaN;
    +0 == -0 only without `signs`), else within the tolerance of the dtype `tolerance` names, or of its own."""
    if ref.shape != got.shape or ref.dtype != got.dtype:  # an OutputMismatch, so that the blame looks for its kernel
        raise OutputMismatch(f"output '{name}': optimized gives {got.dtype}{list(got.shape)}, "
                             f"original {ref.dtype}{list(ref.shape)}", name)
    result.compared += 1
    if exact or ref.dtype.kind not in "fc":
        result.exact += 1
        if ref.dtype.kind in "fc":
            same = (ref == got) | (np.isnan(ref) & np.isnan(got))
            if signs and ref.dtype.kind == "f":
                same &= (np.signbit(ref) == np.signbit(got)) | np.isnan(ref)
        else:
            same = ref == got
        if not same.all():
            bad = np.argwhere(~same)
            first = tuple(int(x) for x in bad[0]) if bad.size else ()
            raise OutputMismatch(f"output '{name}' must match exactly but differs at {len(bad)} positions, "
                                 f"first {list(first)}: optimized {got[first]!r}, original {ref[first]!r}", name)
        return
    key = tolerance if tolerance is not None and ref.dtype.kind == "f" else str(ref.dtype)
    finite = np.isfinite(ref)
    scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 1.0
    atol = ATOL_SCALE.get(key, 1e-3) * max(1.0, scale)
    rtol = RTOL.get(key, 1e-3)
    ok = np.isclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)
    if key == "float16":  # a float beyond float16's range rounds to an infinity of its sign
        ok |= np.isinf(got) & (np.abs(ref) >= HALF_OVERFLOW) & (np.signbit(got) == np.signbit(ref))
    if not ok.all():
        bad = np.argwhere(~ok)
        first = tuple(int(x) for x in bad[0])
        raise OutputMismatch(f"output '{name}' differs beyond tolerance (rtol {rtol}, atol {atol:.3g}) at "
                             f"{len(bad)} positions, first {list(first)}: optimized {got[first]!r}, "
                             f"original {ref[first]!r}", name)
    finite &= np.isfinite(got)  # an overflow to infinity accepted above is no relative error
    with np.errstate(all="ignore"):
        rel = np.abs(got[finite].astype(np.float64) - ref[finite]) / np.maximum(np.abs(ref[finite]), 1e-30)
    if rel.size:
        result.max_rel_err = max(result.max_rel_err, float(np.nanmax(np.where(np.abs(ref[finite]) > atol, rel, 0))))


def _large_integers_round(ref: np.ndarray, got: np.ndarray, result: CheckResult) -> bool:
    """Whether the integer output of an inexact kernel differs only where float32 rounding shows in a large
    integer: within float32's relative tolerance of onnxruntime's value (never at magnitudes below 1 / RTOL,
    where the step between neighbouring floats is below 1 and any difference is a decision, `_flips_at_thresholds`).
    Exp's last bit against onnxruntime's, cast to int64, moves 6.2e16 by 2^32 (fuzz seed 170001). Counted in
    `result.flips`."""
    if ref.dtype.kind not in "iu":
        return False
    bad = ref != got
    r, g = ref[bad].astype(np.float64), got[bad].astype(np.float64)
    rtol = RTOL["float32"]
    if not (np.abs(g - r) <= rtol * np.abs(r)).all():
        return False
    result.flips += int(bad.sum())
    return True


def _run_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], what: str,
                   optimize: bool = True) -> dict[str, np.ndarray] | None:
    """onnxruntime's outputs of `model` (a reference spelled from the original; without graph optimizations where
    `optimize` is False) by name, or None where it cannot load or run it: a reference that does not run excuses
    nothing. A run that fails in onnxruntime's memory planner (`REUSE_ERROR`: a buffer planned for an inferred
    shape, re-used for an empty-input quirk's other shape) is run again with buffer re-use off, which changes no
    value of a run that completes (fuzz case 202: the extra outputs a reference adds change the plan)."""
    import onnxruntime as ort

    for reuse in (True, False):
        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.enable_mem_reuse = reuse
        if not optimize:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            doing(f"running the original model {what}")
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            return {o.name: np.asarray(v) for o, v in zip(sess.get_outputs(), sess.run(None, dict(feeds)))}
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types
            if REUSE_ERROR not in str(e):
                return None
    return None


def _undefined_in_onnxruntime(original: onnx.ModelProto, name: str, feeds: Mapping[str, np.ndarray],
                              ref: np.ndarray, got: np.ndarray, result: CheckResult) -> bool:
    """`excuses.from_empty_concat` with onnxruntime's runs; counted in `result.undefined`."""
    found = from_empty_concat(original, name, feeds, _run_reference)
    result.undefined += max(1, int((ref != got).sum())) if found else 0
    return found


def _flips_at_thresholds(original: onnx.ModelProto, name: str, feeds: Mapping[str, np.ndarray], ref: np.ndarray,
                         got: np.ndarray, result: CheckResult) -> bool:
    """`excuses.flipped_decisions` with onnxruntime's runs; counted in `result.flips`."""
    flips = flipped_decisions(original, name, feeds, ref, got, _run_reference, RTOL)
    result.flips += flips
    return flips > 0


def _closer_than_onnxruntime(original: onnx.ModelProto, name: str, feeds: Mapping[str, np.ndarray],
                             ref: np.ndarray, got: np.ndarray, result: CheckResult) -> bool:
    """Whether, where the float32 output `name` differs beyond tolerance, evonnx's value is at least as close to
    the original model computed in float64 as onnxruntime's own: a sum of thousands of values with both signs in
    onnxruntime's order is off the float64 sum by more than the tolerance of the result (8,198 values of +-400
    summing to 522, fuzz seed 200028), and no kernel can reproduce that order. Counted in `result.closer`."""

    if ref.dtype != np.float32:
        return False
    wide = as_float64(original)
    if wide is None:
        return False
    values = _run_reference(wide, {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()},
                            "in float64")
    if values is None or name not in values:
        return False
    r64 = values[name]
    if r64.shape != ref.shape:
        return False
    scale = float(np.max(np.abs(ref[np.isfinite(ref)]), initial=1.0))
    atol = ATOL_SCALE["float32"] * max(1.0, scale)
    bad = ~np.isclose(got, ref, rtol=RTOL["float32"], atol=atol, equal_nan=True)
    with np.errstate(all="ignore"):
        g, r, w = got[bad].astype(np.float64), ref[bad].astype(np.float64), r64[bad]
        ok = np.isfinite(g) & np.isfinite(r) & np.isfinite(w) & (np.abs(g - w) <= np.abs(r - w) + atol)
    if not ok.all():
        return False
    result.closer += int(bad.sum())
    return True


def _topk_near_ties(original: onnx.ModelProto, feeds: Mapping[str, np.ndarray], chosen: Mapping[str, np.ndarray],
                    gots: Mapping[str, np.ndarray], exact_outputs: set[str], signed: set[str],
                    result: CheckResult, half: frozenset[str] | set[str] = frozenset()) -> bool:
    """`excuses.near_ties` with onnxruntime's runs and the check's own comparison; counted in `result.topk_ties`."""
    def matches(redone: Mapping[str, np.ndarray]) -> bool:
        try:
            for out in original.graph.output:
                _compare(out.name, redone[out.name], np.asarray(gots[out.name]), out.name in exact_outputs,
                         CheckResult(), out.name in signed, "float16" if out.name in half else None)
        except VerificationError:
            return False
        return True

    if not near_ties(original, feeds, chosen, _run_reference, matches, RTOL):
        return False
    result.topk_ties += 1
    return True


def _same_with_first_nan_rule(original: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                              cache: dict[str, dict[str, np.ndarray] | None], name: str, got: np.ndarray, exact: bool,
                              signs: bool, result: CheckResult, tolerance: str | None = None) -> bool:
    """Whether the output `name` that differs from onnxruntime's on the original matches onnxruntime on the original
    with its float ReduceMax/ReduceMin spelled out with the first-element NaN rule evonnx's kernels apply in every
    lane (`references.first_nan_reference`): onnxruntime's vectorised reductions skip a NaN or not by its SIMD lane
    and the row's address, so the maximum of a row holding a NaN is its true maximum in one lane and not in the
    next (fuzz seed 220022). `cache` holds that run's outputs for `feeds` (None: no such reference). Counted in
    `result.nan_lanes`."""

    if "outputs" not in cache:
        cache["outputs"] = None
        reference = first_nan_reference(original)
        if reference is None:
            return False
        cache["outputs"] = _run_reference(reference, feeds, "with one NaN rule in its reductions")
    outputs = cache["outputs"]
    if outputs is None or name not in outputs:
        return False
    try:
        _compare(name, outputs[name], got, exact, CheckResult(), signs, tolerance)
    except VerificationError:
        return False
    result.nan_lanes += 1
    return True


@contextlib.contextmanager
def _cpu_isa(variant: str) -> Iterator[None]:
    """EVONNX_CPU_ISA=baseline while a session is created, for the "baseline" variant (the runtime reads it when it
    creates each kernel; this is evonnx's own worker process); other variants leave the environment alone."""
    previous = os.environ.get("EVONNX_CPU_ISA")
    if variant == "baseline":
        os.environ["EVONNX_CPU_ISA"] = "baseline"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("EVONNX_CPU_ISA", None)
        else:
            os.environ["EVONNX_CPU_ISA"] = previous


def check_models(original: onnx.ModelProto, optimized: Path, library: Path, exact_outputs: set[str], *,
                 sizes: Mapping[str, int] | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
                 seed: int = 0, equal_symbols: Sequence[tuple[str, str]] = (),
                 user_inputs: Sequence[tuple[str, Mapping[str, np.ndarray]]] = (),
                 cpu_variants: bool | None = None) -> CheckResult:
    """Run both models and compare; raises VerificationError on a mismatch or when no input set runs.

    `cpu_variants` (default: where this machine runs the x86-64-v3 variant of the CPU kernels) runs the optimized
    model twice per input set, once as this machine picks its kernels and once with the baseline variant
    (EVONNX_CPU_ISA=baseline), so a compiler bug in either is caught whichever one a serving machine runs. Where
    only the v3 variant differs it raises VariantError.

    `equal_symbols` are the symbol pairs the plan requires equal (its broadcast checks); `user_inputs` are
    (label, feeds) sets of `--inputs`, each of which must run on the original. Both models run in evonnx's
    worker process (`evonnx.isolate`): onnxruntime crashing on either is a VerificationError that names the
    signal, the model and the input set."""
    check_sizes(original, sizes, shapes)
    try:
        return _check_models(original, Path(optimized).absolute(), Path(library).absolute(), exact_outputs,
                             sizes=sizes, shapes=shapes, seed=seed, equal_symbols=equal_symbols,
                             user_inputs=user_inputs,
                             cpu_variants=cpu_runs_v3() if cpu_variants is None else cpu_variants)
    except CrashError as e:
        about_original = "the original model" in e.doing
        raise VerificationError(("cannot check: " if about_original else "") + str(e)) from None
    except MemoryError as e:
        # the check's inputs and outputs at its sizes: a declared [N, 1000, 1000] at N = 64 is 488 MiB per int64
        # tensor, and the check holds several (fuzz case 1254 raised MemoryError under memory pressure)
        raise VerificationError(f"cannot check: not enough memory for the check's tensors at its sizes "
                                f"({_first_line(e)}); name smaller sizes with --dim or --input-shape") from None


@isolated
def _check_models(original: onnx.ModelProto, optimized: Path, library: Path, exact_outputs: set[str], *,
                  sizes: Mapping[str, int] | None, shapes: Mapping[str, Sequence[int]] | None, seed: int,
                  equal_symbols: Sequence[tuple[str, str]],
                  user_inputs: Sequence[tuple[str, Mapping[str, np.ndarray]]], cpu_variants: bool) -> CheckResult:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # failures become VerificationErrors; onnxruntime prints nothing
    # three sessions live at once (original, optimized, its baseline variant): with onnxruntime's arena each would
    # keep its largest run's memory, and the third could fail for want of what the first two hold (fuzz case 5880)
    so.enable_cpu_mem_arena = False
    try:
        doing("loading the original model")
        ref_sess = ort.InferenceSession(original.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types; report any of them
        raise VerificationError(f"cannot check: onnxruntime cannot load the original model "
                                f"({_first_line(e)})") from e
    so2 = ort.SessionOptions()
    so2.log_severity_level = 4
    so2.enable_cpu_mem_arena = False
    opt_sess = base_sess = None
    load_error: Exception | None = None
    try:
        doing("loading the optimized model")
        register_library(so2, library)
        opt_sess = ort.InferenceSession(str(optimized), so2, providers=["CPUExecutionProvider"])
        if cpu_variants:
            doing("loading the optimized model with the baseline CPU kernels")
            with _cpu_isa("baseline"):
                base_sess = ort.InferenceSession(str(optimized), so2, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types; report any of them
        # reported once the original runs on some input: where it runs on none (a Squeeze of an axis that is
        # always empty), that is what the user needs to hear, and the optimized model, whose shapes evonnx
        # made static, may fail onnxruntime's load-time shape inference for the same reason (fuzz seed 170005)
        load_error = e
    result = CheckResult(variants=("x86-64-v3", "baseline") if cpu_variants else ())
    state = {"last_error": "", "v3_error": ""}
    signed = signed_zero_outputs(original)
    doing("finding the outputs computed through float16 arithmetic")
    half = half_precision_outputs(original)  # compared within float16's tolerance where inexact

    def compare(feeds: Mapping[str, np.ndarray], refs: Sequence[object], gots: Sequence[object],
                into: CheckResult, variant: str) -> None:
        try:
            compare_each(feeds, refs, gots, into)
        except VerificationError as mismatch:
            named = {o.name: np.asarray(g) for o, g in zip(original.graph.output, gots)}
            if not _topk_near_ties(original, feeds, optimized_choices(feeds, variant), named, exact_outputs, signed,
                                   into, half):
                if isinstance(mismatch, OutputMismatch) and not mismatch.kernel:
                    mismatch.kernel = first_differing_kernel(original, optimized, library, feeds, RTOL,
                                                             mismatch.output, lambda: _cpu_isa(variant)) or ""
                raise

    def compare_each(feeds: Mapping[str, np.ndarray], refs: Sequence[object], gots: Sequence[object],
                     into: CheckResult) -> None:
        lanes: dict[str, dict[str, np.ndarray] | None] = {}
        for out, ref, got in zip(original.graph.output, refs, gots):
            ref, got = np.asarray(ref), np.asarray(got)
            # where onnxruntime rounds to float16 is its own choice (model.half_precision_outputs): not exact
            exact = out.name in exact_outputs and not (out.name in half and ref.dtype.kind == "f")
            tolerance = "float16" if out.name in half else None
            try:
                _compare(out.name, ref, got, exact, into, out.name in signed, tolerance)
            except VerificationError:
                if (_same_with_first_nan_rule(original, feeds, lanes, out.name, got, exact, out.name in signed, into,
                                              tolerance)
                        or _undefined_in_onnxruntime(original, out.name, feeds, ref, got, into)):
                    continue
                if exact or ref.shape != got.shape or ref.dtype != got.dtype:
                    raise
                if ref.dtype.kind in "fc":
                    if not _closer_than_onnxruntime(original, out.name, feeds, ref, got, into):
                        raise
                elif not (_large_integers_round(ref, got, into)
                          or _flips_at_thresholds(original, out.name, feeds, ref, got, into)):
                    if not (closer := decided_as_in_float64(original, out.name, feeds, ref, got, _run_reference,
                                                            as_float64)):
                        raise
                    into.closer += closer

    def optimized_choices(feeds: Mapping[str, np.ndarray], variant: str) -> dict[str, np.ndarray]:
        """The indices each TopK left in the optimized model chose on `feeds`, and the values of the original's
        comparisons against a threshold and NonMaxSuppressions that the optimized model computes, by name ({} where
        none)."""
        model = onnx.load(str(optimized))
        names = [n.output[1] for n in model.graph.node if n.op_type == "TopK" and len(n.output) > 1 and n.output[1]]
        made = {t for n in model.graph.node for t in n.output}
        names += [n.output[0] for n in original.graph.node if n.op_type in (*THRESHOLDS, "NonMaxSuppression")
                  and n.output[0] in made and n.output[0] not in names]
        if not names:
            return {}
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in names)
        so = ort.SessionOptions()
        so.log_severity_level = 4
        try:
            register_library(so, library)
            doing("running the optimized model for its near-tie choices")
            with _cpu_isa(variant):
                sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            return {k: np.asarray(v) for k, v in zip(names, sess.run(names, dict(feeds)))}
        except Exception:  # noqa: BLE001 - no probe, no excuse
            return {}

    def run(feeds: Mapping[str, np.ndarray], label: str) -> bool:
        """Both models on `feeds`; False when the original rejects them."""
        try:
            doing(f"running the original model ({label})")
            refs = ref_sess.run(None, dict(feeds))
        except Exception as e:  # noqa: BLE001 - the original rejects these inputs
            state["last_error"] = _first_line(e)
            return False
        if opt_sess is None:
            assert load_error is not None
            raise UnloadableModel(f"onnxruntime cannot load the optimized model: {_first_line(load_error)}") \
                from load_error
        sessions = [("", opt_sess)] if base_sess is None else [("x86-64-v3", opt_sess), ("baseline", base_sess)]
        counted = False
        for variant, sess in sessions:
            if variant == "x86-64-v3" and state["v3_error"]:
                continue  # the v3 kernels differed already: the baseline ones go on alone, to tell the two apart
            where = f", {variant} CPU kernels" if variant else ""
            try:
                try:
                    doing(f"running the optimized model ({label}{where})")
                    gots = sess.run(None, dict(feeds))
                except Exception as e:  # noqa: BLE001
                    message = f"the optimized model fails where the original runs ({label}{where}): {_first_line(e)}"
                    if (fused := _KERNEL_CHECK.search(str(e))) is not None:
                        raise KernelFailure(message, fused.group(1)) from e
                    if _run_reference(original, feeds, "without graph optimizations", optimize=False) is None:
                        raise NodeFailure(message, str(e)) from e
                    raise VerificationError(message) from e
                scratch = CheckResult()
                compare(feeds, refs, gots, scratch if counted else result, variant)
                result.max_rel_err = max(result.max_rel_err, scratch.max_rel_err)
                counted = True
            except VerificationError as e:
                if variant == "baseline" and state["v3_error"]:
                    raise  # both variants differ: the plan's, not a variant's (fuzz case 71 was labelled baseline)
                if variant == "baseline":
                    raise VerificationError(f"{e} (with the baseline CPU kernels, which a machine without AVX2 "
                                            f"runs)") from e
                if variant != "x86-64-v3":
                    raise
                state["v3_error"] = str(e)
        return True

    def run_plan(plan: Mapping[str, int], regimes: Sequence[int] = tuple(range(len(REGIMES)))) -> bool:
        ran = False
        label = "sizes " + (", ".join(f"{k}={v}" for k, v in plan.items()) or "as declared")
        for regime in regimes:
            try:
                feeds = make_inputs(original, {**{s: 3 for s in symbols}, **plan}, seed + len(result.runs) + regime,
                                    shapes, regime)
            except AmbiguousInputs as e:
                state["last_error"] = str(e)
                result.skipped.append(f"{label}: {e}")
                return False
            if run(feeds, label):
                result.runs.append(dict(plan))
                ran = True
        return ran

    for label, feeds in user_inputs:
        if not run(feeds, f"--inputs {label}"):
            raise VerificationError(f"onnxruntime rejects your inputs {label} on the original model: "
                                    f"{state['last_error']}")
        result.user_sets += 1
    symbols = input_symbols(original)
    if sizes or shapes or not symbols:
        run_plan(dict(sizes or {}))
    else:
        run_size_plans(original, symbols, equal_symbols, run_plan, result.skipped)
    if state["v3_error"] and (result.runs or result.user_sets):
        raise VariantError(f"{state['v3_error']} (with the x86-64-v3 CPU kernels only; the baseline ones match on "
                           f"every run)")
    if not result.runs and not result.user_sets:
        raise VerificationError(f"cannot check: onnxruntime rejects every generated input for the original model "
                                f"({state['last_error']}); pass inputs with --inputs, or name sizes with --dim or "
                                f"--input-shape")
    return result


