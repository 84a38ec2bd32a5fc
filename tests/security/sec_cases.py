"""What a fuzz case is and how it runs, apart from how it is drawn (`sec_graphs`): `Tensor` and `Case`, the
integer limits and the exact ops, the seeded inputs of each value regime (`make_feeds`, with `GRID`'s every
combination of special values), and cases from a hand-built model or a kept finding."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
I32_MAX, I32_MIN = 2**31 - 1, -(2**31)

DTYPES = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE,
          "int64": TensorProto.INT64, "int32": TensorProto.INT32, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8,
          "bool": TensorProto.BOOL}
INT_EXTREMES = {
    "int64": (0, 1, -1, 2, -2, 7, I64_MAX, I64_MIN, I64_MAX - 1, I64_MIN + 1, 2**62, -(2**32)),
    "int32": (0, 1, -1, 2, -2, 7, I32_MAX, I32_MIN, I32_MAX - 1, I32_MIN + 1, 2**30, -(2**16)),
    "int8": (0, 1, -1, 2, -2, 7, 127, -128, 126, -127),
    "uint8": (0, 1, 2, 7, 128, 254, 255),
}
FLOAT_VALUES = (0.0, -0.0, 1.0, -1.5, 0.5, 3.0, 1e30, -1e30, float("inf"), float("-inf"), 1e-40, 65504.0)
SLICE_STARTS = (0, 1, -1, 2, -2, -3, 5, 100, I64_MAX, I64_MIN, -I64_MAX, -100)
SLICE_ENDS = (I64_MAX, -1, 1, 2, 3, 0, -100, I64_MIN, 100, -I64_MAX, -2)
SLICE_STEPS = (1, 1, 2, -1, -2, 3, I64_MIN, I64_MAX, -I64_MAX, -3)
# Exact in IEEE arithmetic as onnxruntime and evonnx compute them: results must match bit for bit. Log is not
# (evonnx's evo_logf is within 1 ulp, onnxruntime's Eigen log within 2; the boxes step drew it first, and seed
# 960010 counted a last-bit difference as a finding); Sqrt is, correctly rounded in both.
# Tanh, Erf, Sin, Cos, Softplus and Pow (other than by 1, 2 or 3) are evonnx's own polynomials or libm's.
INEXACT_OPS = {"Exp", "Log", "Sigmoid", "ReduceSum", "ReduceMean", "MatMul", "Softmax", "Conv", "Tanh", "Erf",
               "Sin", "Cos", "Softplus", "Pow"}

Dim = int | str  # an int, a symbol (an input's dim_param) or "?k", a size known only at run time


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class Case:
    """One fuzz case: the model and how to run it."""

    model: onnx.ModelProto
    inputs: list[Tensor]  # graph inputs, shapes with symbols
    symbols: list[str]
    plans: list[dict[str, int]]  # symbol sizes of each run
    value_regime: str
    seed: int
    exact: bool  # every float output must match bit for bit
    file_name: str  # base name of the optimized model (the library is named after it)
    canaries: list[str] = field(default_factory=list)  # canary identifiers placed in the model's text
    steps: list[str] = field(default_factory=list)  # one word per op step, for summaries

    def describe(self) -> str:
        ins = ", ".join(f"{_short(i.name)}:{i.dtype}[{','.join(_short(str(d)) for d in i.shape)}]" for i in self.inputs)
        ops = " ".join(n.op_type for n in self.model.graph.node)
        return (f"inputs {ins}; nodes {ops}; sizes {[{_short(k): v for k, v in p.items()} for p in self.plans]}; "
                f"values {self.value_regime}")


def _short(text: str, limit: int = 24) -> str:
    r = repr(text)[1:-1]
    return r if len(r) <= limit else r[: limit - 3] + "..."


# -- shape helpers ----------------------------------------------------------------------------------------------
def _bcast_dim(a: Dim, b: Dim, allow_symbols: bool) -> Dim | None:
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    # Two input symbols may broadcast (onnxruntime accepts either being 1); sizes known only at run time ("?k",
    # from a Slice or a Concat) would almost never agree with anything, so they do not.
    if isinstance(a, str) and isinstance(b, str) and allow_symbols and not (a + b).startswith("?") and "?" != b[:1]:
        return f"?bcast({a},{b})"
    return None


def broadcast(a: Sequence[Dim], b: Sequence[Dim], allow_symbols: bool = False) -> tuple[Dim, ...] | None:
    n = max(len(a), len(b))
    pa, pb = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(pa, pb):
        d = _bcast_dim(x, y, allow_symbols)
        if d is None:
            return None
        out.append(d)
    return tuple(out)


def _static(shape: Sequence[Dim]) -> bool:
    return all(isinstance(d, int) for d in shape)


def _numel(shape: Sequence[Dim]) -> int | None:
    return math.prod(shape) if _static(shape) else None  # type: ignore[arg-type]


def _plan_elements(inputs: Sequence[Tensor], plan: dict[str, int]) -> int:
    return sum(math.prod(plan.get(d, 1) if isinstance(d, str) else d for d in t.shape) for t in inputs)


# -- inputs -------------------------------------------------------------------------------------------------------
def concrete_shape(t: Tensor, plan: dict[str, int]) -> list[int]:
    return [plan[d] if isinstance(d, str) else d for d in t.shape]


# The "grid" regime: input k of n elements holds GRID[(i // len**k) % len] at flat position i, so that inputs of
# len**count elements meet every combination of these values.
_F32 = np.finfo(np.float32)
_F64 = np.finfo(np.float64)
GRID = {"float16": [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 2.5, -3.5, 6e-08, 65504.0, -65504.0],
        "float32": [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 2.5, -3.5, 1e-40, _F32.max, _F32.min],
        "float64": [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 2.5, -3.5, 5e-324, _F64.max, _F64.min],
        **{t: [np.iinfo(t).min, np.iinfo(t).max, 0, 1, -1, 2, -2, 7, np.iinfo(t).min + 1, np.iinfo(t).max - 1]
           for t in ("int64", "int32", "int16", "int8")},
        **{t: [0, 1, 2, 7, np.iinfo(t).max, np.iinfo(t).max - 1] for t in ("uint8", "uint16", "uint32", "uint64")},
        "bool": [False, True]}
# int64 also at the edges of its 32-bit halves: onnxruntime's SIMD loops compare some int64 ops by halves (fuzz seed
# 4000017: Sign(2**31) is -1)
GRID["int64"] += [1 << 31, -(1 << 31) - 1, (1 << 32) + 5]


def make_feeds(inputs: Sequence[Tensor], plan: dict[str, int], regime: str, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs: small values, wide ones, integer extremes, or floats with inf/nan/-0/denormals mixed in."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for k, t in enumerate(inputs):
        shape = concrete_shape(t, plan)
        if regime == "grid":  # every combination of special values over the inputs (see GRID)
            g = np.asarray(GRID[t.dtype], dtype=t.dtype)
            n = int(np.prod(shape))
            feeds[t.name] = g[(np.arange(n) // len(g) ** k) % len(g)].reshape(shape)
            continue
        if t.dtype in ("float16", "float32", "float64"):
            scale = {"small": 2.0, "wide": 400.0, "extreme": 1e30, "special": 3.0}[regime]
            with np.errstate(over="ignore"):  # "extreme" overflows float16 to infinity, as meant
                arr = np.asarray(rng.standard_normal(shape) * scale, dtype=t.dtype)
            if regime == "special" and arr.size:
                specials = np.array([np.inf, -np.inf, np.nan, -0.0, 1e-40, 0.0], t.dtype)
                mask = rng.random(shape) < 0.3
                arr[mask] = rng.choice(specials, size=int(mask.sum()))
        elif t.dtype == "bool":
            arr = np.asarray(rng.random(shape) < 0.5)
        else:
            info = np.iinfo(t.dtype)
            lo = max(info.min, -2000)  # (0 for the unsigned types)
            if regime in ("small", "special"):
                arr = np.asarray(rng.integers(max(lo, -8), 8, size=shape), dtype=t.dtype)
            elif regime == "wide":
                arr = np.asarray(rng.integers(lo, min(info.max, 2000), size=shape), dtype=t.dtype)
            else:
                arr = np.asarray(rng.integers(info.min, info.max, size=shape, dtype=t.dtype, endpoint=True))
                ext = np.array([info.min, info.max, 0, max(info.min, -1), 1], dtype=t.dtype)
                mask = rng.random(shape) < 0.3
                arr[mask] = rng.choice(ext, size=int(mask.sum()))
        feeds[t.name] = np.array(arr, dtype=t.dtype, copy=True)
    return feeds


def case_from_model(model: onnx.ModelProto, plans: Sequence[dict[str, int]], *, exact: bool = True,
                    value_regime: str = "small", seed: int = 0, file_name: str = "model.opt.onnx") -> Case:
    """A `Case` for a hand-built model (the regression tests): its inputs read from the graph."""
    init = {t.name for t in model.graph.initializer}
    inputs = []
    for vi in model.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name
        shape = tuple(d.dim_param if d.HasField("dim_param") else d.dim_value for d in tt.shape.dim)
        inputs.append(Tensor(vi.name, dtype, shape))
    symbols = list(dict.fromkeys(d for t in inputs for d in t.shape if isinstance(d, str)))
    return Case(model=model, inputs=inputs, symbols=symbols, plans=[dict(p) for p in plans],
                value_regime=value_regime, seed=seed, exact=exact, file_name=file_name)


def case_from_finding(path: Path) -> Case:
    """The `Case` of a finding kept by the fuzzer (`sec_oracle.save_finding`): `<key>.onnx` and the first two lines
    of `<key>.txt` (sizes, value regime, exactness, file name and seed), as it was drawn."""
    text = path.with_suffix(".txt").read_text()
    plans = ast.literal_eval(re.search(r"; sizes (\[.*?\]); values ", text).group(1))  # type: ignore[union-attr]
    regime = re.search(r"; values (\w+)\n", text).group(1)  # type: ignore[union-attr]
    match = re.search(r"\nexact: (True|False); file name (.*); seed (\d+)\n", text)
    assert match is not None, f"{path}: not a finding's summary"
    model = onnx.load(str(path))
    symbols = case_from_model(model, []).symbols  # in the order the summary printed them (shortened there)
    return case_from_model(model, [dict(zip(symbols, p.values())) for p in plans], exact=match.group(1) == "True",
                           value_regime=regime, seed=int(match.group(3)), file_name=ast.literal_eval(match.group(2)))
