"""Which fused kernel a mismatch of the check starts in (`first_differing_kernel`).

Where an output of the optimized model differs from onnxruntime's on the original, the check runs both models once
more on the same inputs with every Fused node's outputs made graph outputs (each is a tensor of the original too),
and names the first kernel, in the optimized graph's order, whose outputs differ from onnxruntime's values of the
same tensors. `optimize` then leaves that kernel's nodes to onnxruntime and plans, builds and checks again (fuzz
case 260: a ReduceProd of 300 values near 400 overflows to inf before reaching a zero in onnxruntime's SIMD order
and gives NaN; the kernel's order reaches the zero first and gives 0), rather than refusing the whole model for one
kernel. Nothing is excused: the model written is the one the full check passes.

Runs in the check's worker process (`evonnx.isolate`), where onnxruntime may crash.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx

from evonnx.isolate import doing, register_library
from evonnx.model import DOMAIN

# why `optimize` left a blamed kernel's nodes to onnxruntime (the plan's rejections, the report's summary)
_REASON = "left to onnxruntime: kernel {kernel}, made of it, differed from onnxruntime at the check ({error})"
_PREFIX = "left to onnxruntime: kernel "


def blame_reason(kernel: str, error: str) -> str:
    return _REASON.format(kernel=kernel, error=error[:160])


def blamed_kernel(reason: str) -> str | None:
    """The kernel a rejection's `reason` (`blame_reason`) blames; None for other reasons."""
    return reason[len(_PREFIX):].split(",", 1)[0] if reason.startswith(_PREFIX) else None


def differs(ref: np.ndarray, got: np.ndarray, rtol: Mapping[str, float]) -> bool:
    """Whether a kernel's output `got` differs from onnxruntime's `ref` of the same tensor: in shape or dtype, in a
    NaN's place, or beyond the relative tolerance `rtol` gives its dtype (exactly, for integers and booleans)."""
    if ref.shape != got.shape or ref.dtype != got.dtype:
        return True
    if ref.dtype.kind not in "fc":
        return not np.array_equal(ref, got)
    r = rtol.get(ref.dtype.name, rtol["float32"])
    scale = float(np.max(np.abs(ref[np.isfinite(ref)]), initial=0.0))
    return not np.allclose(got, ref, rtol=r, atol=r * 0.1 * max(scale, 1.0), equal_nan=True)


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in names if t not in have)
    return out


def _upstream_kernels(model: onnx.ModelProto, output: str) -> set[str]:
    """The Fused nodes of `model`'s graph whose outputs `output` is computed from."""
    producer = {t: n for n in model.graph.node for t in n.output if t}
    seen: set[str] = set()
    found: set[str] = set()
    stack = [output]
    while stack:
        t = stack.pop()
        n = producer.get(t)
        if n is None or t in seen:
            continue
        seen.add(t)
        if n.domain == DOMAIN and n.op_type == "Fused":
            found.add(n.name)
        stack.extend(i for i in n.input if i)
    return found


def first_differing_kernel(original: onnx.ModelProto, optimized: Path, library: Path,
                           feeds: Mapping[str, np.ndarray], rtol: Mapping[str, float], output: str | None = None,
                           isa: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext
                           ) -> str | None:
    """The name of the first Fused node of `optimized` whose outputs differ from onnxruntime's on `original` for
    `feeds` (`differs` with the relative tolerances `rtol`, by dtype). Where none does, the first one `output` is
    computed from whose outputs are not onnxruntime's bits: a difference in the last bit that a node onnxruntime
    runs after it amplifies past any tolerance (a cos of a sum of exps near 1e300 in float64, fuzz cases 2074 and
    2075 of the long run on da57773) starts there. Where every kernel gives onnxruntime's bits, the last kernel
    `output` is computed from (exposing the tensors changed onnxruntime's float16 roundings). None where no kernel
    computes `output`, or either model fails to run with its kernels' outputs exposed. `isa` makes the context in
    which the optimized model's session is created (the CPU kernels' variant)."""
    import onnxruntime as ort

    model = onnx.load(str(optimized))
    produced = {t for n in original.graph.node for t in n.output if t}
    kernels = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type == "Fused"]
    names = list(dict.fromkeys(t for n in kernels for t in n.output if t in produced))
    if not names:
        return None
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so2 = ort.SessionOptions()
    so2.log_severity_level = 4
    so.enable_cpu_mem_arena = so2.enable_cpu_mem_arena = False  # as the check's sessions (verify._check_models)
    try:
        doing("running the original model with the fused kernels' tensors as outputs")
        ref_sess = ort.InferenceSession(_with_outputs(original, names).SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
        refs = dict(zip(names, ref_sess.run(names, dict(feeds))))
        doing("running the optimized model with its kernels' outputs exposed")
        register_library(so2, library)
        with isa():
            opt_sess = ort.InferenceSession(_with_outputs(model, names).SerializeToString(), so2,
                                            providers=["CPUExecutionProvider"])
        gots = dict(zip(names, opt_sess.run(names, dict(feeds))))
    except Exception:  # noqa: BLE001 - onnxruntime raises several unrelated types; no run, no blame
        return None
    for n in kernels:
        if any(t in refs and differs(np.asarray(refs[t]), np.asarray(gots[t]), rtol) for t in n.output):
            return n.name
    upstream = _upstream_kernels(model, output) if output else set()
    for n in kernels:
        if n.name in upstream and any(t in refs and not _same_bits(np.asarray(refs[t]), np.asarray(gots[t]))
                                      for t in n.output):
            return n.name
    # Every kernel gave onnxruntime's bits, once its outputs were graph outputs: exposing them changed what
    # onnxruntime computes. It runs a float16 op it has no float16 kernel for in float32 between Casts and drops
    # the Cast to float16 between two such ops, so an Exp of 11.1 stays 66,000 on its way into a Mul of 0 (-0)
    # unless it is a graph output, rounded to float16's inf (fuzz case 3576 of the long run on da57773: the
    # kernel's Exp rounds as ONNX says, and 0 * -inf is NaN). The kernel nearest the output goes back.
    nearest = [n for n in kernels if n.name in upstream]
    return nearest[-1].name if nearest else None


def _same_bits(ref: np.ndarray, got: np.ndarray) -> bool:
    return ref.shape == got.shape and ref.dtype == got.dtype and ref.tobytes() == got.tobytes()

