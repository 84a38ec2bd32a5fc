"""The check's size plans (`run_size_plans`): which sizes the symbolic dims of the original's inputs get on each run.

Distinct primes per class of symbols (the plan's broadcast checks tie some together; symbols onnxruntime itself
ties are merged until it runs), in every value regime; large distinct primes (the biggest input near
`LARGE_ELEMENTS`, above the kernels' parallel threshold); all 1 and all 0. Where fewer than two of those run, every
symbol at one size from `SIZE_CANDIDATES`, and then distinct multiples of a detector's stride (`stride_plans`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

from evonnx.errors import VerificationError
from evonnx.inputs import REGIMES, synthesize, unfeedable
from evonnx.isolate import doing
from evonnx.model import infer_shapes, overridable

SIZE_CANDIDATES = (3, 5, 64, 256, 1024)  # all symbols at one size: the fallback when distinct sizes never run
PRIMES = (3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73)
# The largest generated input of the large run: above the kernels' parallel threshold (EVO_PAR_MIN element
# operations per task, kernels/templates/prelude.c) for any kernel reading it.
LARGE_ELEMENTS = 1 << 18
# Elements of any tensor of the large run that shape inference can size: far above the parallel threshold.
LARGE_TENSOR_ELEMENTS = 1 << 24
# Elements of one generated input: real post-processing inputs have a few million (1x25200x85, 1x3x1333x800);
# 2**26 float64 draws take 512 MiB. Larger declared sizes are refused rather than allocated.
MAX_INPUT_ELEMENTS = 1 << 26
# Elements of any tensor whose shape is known before running: the check refuses rather than asks onnxruntime for
# terabytes (a declared dim of 2**40, a `Range(0, 2**40)`).
MAX_TENSOR_ELEMENTS = 1 << 28


def _classes(symbols: Sequence[str], equal: Sequence[tuple[str, str]]) -> list[list[str]]:
    """The symbols grouped by the equalities `equal` (union-find), in order of first appearance."""
    parent = {x: x for x in symbols}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in equal:
        if a in parent and b in parent:
            parent[root(a)] = root(b)
    groups: dict[str, list[str]] = {}
    for x in symbols:
        groups.setdefault(root(x), []).append(x)
    return list(groups.values())


def _assign(classes: Sequence[Sequence[str]], values: Sequence[int]) -> dict[str, int]:
    return {x: v for cls, v in zip(classes, values) for x in cls}


def _primes_from(start: int, n: int) -> list[int]:
    out: list[int] = []
    k = max(start, 2)
    while len(out) < n:
        if all(k % p for p in range(2, math.isqrt(k) + 1)):
            out.append(k)
        k += 1
    return out


def _largest_input(model: onnx.ModelProto, sizes: Mapping[str, int]) -> int:
    init = {t.name for t in model.graph.initializer}
    out = 0
    for i in model.graph.input:
        if i.name in init:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else sizes.get(d.dim_param or f"{i.name}:{k}", 1)
                 for k, d in enumerate(i.type.tensor_type.shape.dim)]
        out = max(out, math.prod(shape))
    return out


def _largest_tensor(model: onnx.ModelProto, sizes: Mapping[str, int]) -> int:
    """Elements of the largest tensor ONNX shape inference finds with the inputs at `sizes`; 0 where it finds none or
    fails."""
    static = onnx.ModelProto()
    static.CopyFrom(model)
    del static.graph.value_info[:]
    # nor the graph's outputs: ONNX's inference leaves a declared output as it is, so a tensor that is also an output
    # went unsized, and one whose declared shape contradicts the inferred one failed the whole inference (a Gather of
    # an [N, N] input by itself, declared [0, 0, 0], is [N, N, N]: 1 GB at N = 509; fuzz case 2726). Without them,
    # every tensor a node writes is inferred into value_info
    del static.graph.output[:]
    for i in static.graph.input:
        for d in i.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in sizes:
                d.dim_value = sizes[d.dim_param]
    try:
        # no data propagation: onnx's crashes on some models (Slice with step INT64_MAX, fuzz seed 240015), and
        # this runs in the check's worker on untrusted models
        doing("sizing the large run by shape inference")
        typed = infer_shapes(static)
    except Exception:  # noqa: BLE001 - an unknown size bounds nothing
        return 0
    out = 0
    for vi in typed.graph.value_info:
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            out = max(out, math.prod(d.dim_value for d in dims))
    return out


def _large_plan(model: onnx.ModelProto, classes: Sequence[Sequence[str]], small: Mapping[str, int]
                ) -> dict[str, int] | None:
    """Distinct prime sizes, the largest such that no input exceeds LARGE_ELEMENTS and no tensor shape inference
    sizes exceeds LARGE_TENSOR_ELEMENTS (Equal(x[N], x[N, 1]) is [N, N]: a pairwise IoU matrix at N = 65537 takes
    17 GB, twice, where the check runs both models; fuzz seed 230005); None when that is no larger than the small
    plan."""
    def fits(plan: Mapping[str, int], tensors: bool) -> bool:
        return _largest_input(model, plan) <= LARGE_ELEMENTS and (
            not tensors or _largest_tensor(model, plan) <= LARGE_TENSOR_ELEMENTS)

    def search(tensors: bool) -> dict[str, int]:
        lo, hi = 2, 1 << 16
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(_assign(classes, _primes_from(mid, len(classes))), tensors):
                lo = mid
            else:
                hi = mid - 1
        return _assign(classes, _primes_from(lo, len(classes)))

    plan = search(False)
    if not fits(plan, True):  # shape inference only where the inputs alone would allow a larger tensor
        plan = search(True)
        if not fits(plan, True):
            return None
    return plan if _largest_input(model, plan) > _largest_input(model, small) else None


def run_size_plans(original: onnx.ModelProto, symbols: Sequence[str], equal: Sequence[tuple[str, str]],
                    run_plan: Callable[..., bool], skipped: list[str]) -> None:
    """The size plans of the module's docstring; at least two distinct sizings must run."""
    classes = _classes(symbols, equal)
    small = _assign(classes, PRIMES[: len(classes)] if len(classes) <= len(PRIMES)
                    else _primes_from(3, len(classes)))
    ran = run_plan(small, (0,))
    while not ran and len(classes) > 1:
        # onnxruntime ties some of them together (a broadcast in a node it runs): merge the first pair that runs
        merged = None
        for a in range(len(classes)):
            for b in range(a + 1, len(classes)):
                trial = [c for k, c in enumerate(classes) if k not in (a, b)] + [classes[a] + classes[b]]
                plan = _assign(trial, PRIMES[: len(trial)])
                if run_plan(plan, (0,)):
                    merged, small = trial, plan
                    break
            if merged is not None:
                break
        if merged is None:
            classes = [list(symbols)]
            small = _assign(classes, (3,))
            ran = run_plan(small, (0,))
        else:
            classes, ran = merged, True
    sized = int(ran)
    if sized:
        run_plan(small, tuple(range(1, len(REGIMES))))
    large = _large_plan(original, classes, small) if sized else None
    if large is not None:
        sized += run_plan(large)
    for plan, what in ((_assign(classes, [1] * len(classes)), "1"), (_assign(classes, [0] * len(classes)), "0")):
        if run_plan(plan):
            sized += 1
        else:
            skipped.append(f"all sizes {what} (onnxruntime fails on the original there)")
    if sized >= 2:
        return
    base = None
    for cand in SIZE_CANDIDATES:  # the fallback: every symbol at one size
        plan = {s: cand for s in symbols}
        if _largest_input(original, plan) > MAX_INPUT_ELEMENTS:
            # larger candidates are larger still: what ran stands (yolo26n's end-to-end head, dynamic, runs from
            # 256 on, where 1024 would be a [1024, 3, 1024, 1024] input)
            skipped.append(f"all sizes {cand} and up (an input over {MAX_INPUT_ELEMENTS} elements)")
            break
        ran = run_plan(plan)
        base = cand if ran and base is None else base
        sized += ran
        if sized >= 2:
            break
    if base is not None and len(classes := _classes(symbols, equal)) > 1:
        _run_stride_plans(original, classes, base, run_plan, skipped)


def stride_plans(original: onnx.ModelProto, classes: Sequence[Sequence[str]], base: int) -> list[dict[str, int]]:
    """Distinct sizes for a model that runs only with every symbol at `base`, a multiple of 32: a detector's H and W
    must be multiples of its stride (32, or 64 for a P6 model), which distinct primes never are. Each class gets
    `base` plus its own multiple of the stride; and, for the batch, one class at a time gets 2 instead. Smallest
    input first; none over MAX_INPUT_ELEMENTS."""
    step = min(base & -base, 64)
    if step < 32:
        return []
    spread = _assign(classes, [base + step * k for k in range(len(classes))])
    plans = [spread] + [_assign(classes, [2 if k == j else base + step * (k + 1) for k in range(len(classes))])
                        for j in range(len(classes))]
    plans = [p for p in plans if _largest_input(original, p) <= MAX_INPUT_ELEMENTS]
    return sorted(plans, key=lambda p: _largest_input(original, p))


def _run_stride_plans(original: onnx.ModelProto, classes: Sequence[Sequence[str]], base: int,
                      run_plan: Callable[..., bool], skipped: list[str]) -> None:
    """After the fallback ran every symbol at one size `base`, the first `stride_plans` plan onnxruntime runs on
    the original, in every value regime: without it a kernel that mixes up H and W would pass the check of a
    detector. Noted in `skipped` where none runs (the model may require the sizes equal)."""
    for plan in stride_plans(original, classes, base):
        if run_plan(plan, (0,)):
            run_plan(plan, tuple(range(1, len(REGIMES))))
            return
    skipped.append(f"distinct sizes that are multiples of the stride near {base} (onnxruntime fails on the "
                          f"original there)")


def input_symbols(model: onnx.ModelProto) -> list[str]:
    """The size symbols of `model`'s inputs in order of appearance: each dim_param, and `input:axis` for a dim
    with neither a name nor a value."""
    out: list[str] = []
    for i in model.graph.input:
        for k, d in enumerate(i.type.tensor_type.shape.dim):
            name = d.dim_param if d.HasField("dim_param") else ("" if d.HasField("dim_value") else f"{i.name}:{k}")
            if name and name not in out:
                out.append(name)
    return out


def make_inputs(model: onnx.ModelProto, sizes: Mapping[str, int], seed: int,
                shapes: Mapping[str, Sequence[int]] | None = None, regime: int = 0) -> dict[str, np.ndarray]:
    """`evonnx.inputs.synthesize` at the input shapes `sizes` (per symbol) and `shapes` (per input) give. An input
    with an initializer (a default the user may override) is left to its default in the first regime and fed a
    synthesized value in the others."""
    _check_feedable(model)
    init = {t.name: t for t in model.graph.initializer}
    defaults = set(overridable(model))
    dims: dict[str, list[int]] = {}
    for i in model.graph.input:
        if i.name not in init:
            dims[i.name] = _input_shape(i, sizes, shapes)
        elif regime > 0 and i.name in defaults:
            dims[i.name] = list(init[i.name].dims)
    return synthesize(model, dims, seed, REGIMES[regime])


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


def _check_feedable(model: onnx.ModelProto) -> None:
    if (why := unfeedable(model)) is not None:
        raise VerificationError(why)


def check_sizes(model: onnx.ModelProto, sizes: Mapping[str, int] | None = None,
                shapes: Mapping[str, Sequence[int]] | None = None) -> None:
    """Refuse a check that would ask for terabytes, before any work: a tensor whose shape is known above
    MAX_TENSOR_ELEMENTS, an input at the named sizes above MAX_INPUT_ELEMENTS, a negative size; and one it cannot
    feed (`inputs.unfeedable`: bfloat16 ...) or whose input has no shape at all."""
    _check_static_sizes(model)
    try:
        _check_feedable(model)
    except VerificationError as e:
        raise VerificationError(f"cannot check: {e}; skip the check with --no-check") from None
    base = {**{s: 3 for s in input_symbols(model)}, **(sizes or {})}
    init = {t.name for t in model.graph.initializer}
    for i in model.graph.input:
        if i.name not in init:
            _input_shape(i, base, shapes)


def _input_shape(i: onnx.ValueInfoProto, sizes: Mapping[str, int], shapes: Mapping[str, Sequence[int]] | None
                 ) -> list[int]:
    if shapes and i.name in shapes:
        shape = [int(n) for n in shapes[i.name]]
    elif i.type.HasField("tensor_type") and not i.type.tensor_type.HasField("shape"):
        raise VerificationError(f"cannot check: input '{i.name}' has no shape in the model (not even a rank); name "
                                f"one with --input-shape {i.name}=D0,D1,..")
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
