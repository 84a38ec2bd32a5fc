"""The cost model the search planner minimises: memory traffic, per-kernel overhead and recomputation.

Estimated time (µs), a roofline (memory traffic and arithmetic overlap in a streaming loop):
- a node onnxruntime runs: `ort_node_us + max(bytes(inputs, outputs) * ns_per_byte, elements * ops)`;
- a fused group: `kernel_us + max(bytes(group inputs, materialised outputs) * ns_per_byte, sum over its nodes
  of demand * ops)`, where a node's *demand* is how many of its elements the group computes. That is its size
  when it is materialised, plus what its in-group consumers read: one element per consumer element, or one
  per row when the consumer broadcasts it along the innermost axis (code generation hoists it out of the inner
  loop); consumers that read the same element share it (common subexpressions), so the largest consumer
  demand counts. Anything above its size is recomputation.

Sizes use the sizes the check runs at, or 1024 for a symbolic dim nobody named. The constants come from a short
micro-benchmark of this machine (`calibrate`, about a second, cached per machine and onnxruntime version): an
onnxruntime node chain for the per-node cost, a large copy for the bandwidth, and a small C loop built with the
kernels' compiler and flags for the arithmetic;
`CostModel()` holds defaults measured on the development machine, used when calibration is off.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from evonnx import expr as E
from evonnx.index import Atom, Poly, Var, evaluate, var
from evonnx.passes.analyze import Analysis
from evonnx.passes.lower_reduce import weights_bounded
from evonnx.paths import cache_dir
from evonnx.toolchain import c_compiler, kernel_cflags

log = logging.getLogger(__name__)

NOMINAL_SIZE = 1024
# Calls into libm (or evonnx's own exp): priced like the micro-benchmark's expf. Division and sqrt are single
# (vectorisable) instructions and count as simple operations.
SPECIAL = {"exp", "exp_nonpos", "log", "sigmoid", "tanh", "erf", "sin", "cos", "softplus", "mish", "pow"}


@dataclass(frozen=True)
class CostModel:
    # Defaults: `calibrate()` on the development machine (2-core AMD EPYC, 2026-11-22).
    ort_node_us: float = 0.17  # onnxruntime's cost per node beyond its memory traffic
    kernel_us: float = 0.25  # a Fused node: dispatch, shape checks, task setup
    ns_per_byte: float = 0.019  # streaming memory traffic
    ns_per_op: float = 0.021  # one simple operation on one element
    ns_per_special: float = 1.5  # exp, log, sigmoid, ... on one element
    ns_per_reduce_step: float = 0.12  # one step of a fused reduction (vectorised through omp simd)
    ort_row_ns: float = 12.0  # onnxruntime's Softmax per row, beyond its elements' (its kernel calls per row)
    source: str = "defaults"

    def node_us(self, bytes_: float, elements: float, ops: Ops) -> float:
        """onnxruntime running one node: its reductions are vectorised, so their steps cost simple operations."""
        return self.ort_node_us + self.roofline(bytes_, elements * (
            (ops[0] + ops[2]) * self.ns_per_op + ops[1] * self.ns_per_special))

    def fused_ns(self, elements: float, ops: Ops) -> float:
        """Arithmetic of `elements` elements of a node inside a generated kernel."""
        return elements * (ops[0] * self.ns_per_op + ops[1] * self.ns_per_special + ops[2] * self.ns_per_reduce_step)

    def roofline(self, bytes_: float, compute_ns: float) -> float:
        """µs for a streaming loop: memory traffic and arithmetic overlap, so the slower one bounds it."""
        return max(bytes_ * self.ns_per_byte, compute_ns) / 1e3


Ops = tuple[float, float, float]  # per element: simple operations, special functions, reduction steps


@dataclass
class NodeStats:
    """Per-node inputs to the cost model, at nominal sizes."""

    numel: dict[str, float] = field(default_factory=dict)  # tensor -> elements
    nbytes: dict[str, float] = field(default_factory=dict)  # tensor -> bytes
    ops: dict[str, Ops] = field(default_factory=dict)  # node -> (simple, special, reduction steps) per element
    # onnxruntime's own operation counts where they differ from a fused node's: its Softmax computes each exp once
    # (stored, then scaled), where a fused element computes its own exp beside the row sum's
    ort_ops: dict[str, Ops] = field(default_factory=dict)
    ort_rows: dict[str, float] = field(default_factory=dict)  # rows of a node onnxruntime runs row by row
    # a node's operations in a group that does not materialise its output: a Softmax whose consumers are all
    # MatMuls by constant weights (lower_reduce._matmul: the exps summed and weighted in one loop, once each)
    shared_ops: dict[str, Ops] = field(default_factory=dict)
    row_broadcast: dict[tuple[str, str], bool] = field(default_factory=dict)  # (consumer, input) read per row


def _numel(shape: tuple[Poly, ...] | None, env: Mapping[str, int]) -> float:
    if shape is None:
        return float(NOMINAL_SIZE)
    n = 1.0
    for d in shape:
        try:
            n *= max(evaluate(d, env), 0)
        except (KeyError, ZeroDivisionError):
            n *= NOMINAL_SIZE
    return n


def _op_counts(e: E.Expr, env: Mapping[str, int], inner: object = None) -> Ops:
    """(simple, special, reduction steps) per element of `e`, as code generation computes it: each distinct
    subexpression once (common subexpressions), inside a reduction as often as the reduction's extent only where it
    depends on that reduction's variable (code generation hoists the rest before the reduction's loop: a Softmax's
    row sum inside a MatMul's sum is computed once per element, not once per step). A reduction that does not
    depend on the innermost loop variable `inner` is computed once per row, so it is amortised over the row."""
    simple = special = steps = 0.0
    row = 1.0
    if isinstance(inner, Var):
        row = max(float(evaluate(inner.extent, env)), 1.0)
    fv: dict[E.Expr, frozenset[Atom]] = {}
    seen: set[E.Expr] = set()
    # (subexpression, the reductions enclosing it as (variable, extent), weight of its whole subtree)
    stack: list[tuple[E.Expr, tuple[tuple[Atom, float], ...], float]] = [(e, (), 1.0)]
    while stack:
        x, enclosing, base = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        free = E.free_vars(x, fv)
        weight = base
        for atom, ext in enclosing:
            if atom in free:
                weight *= ext
        if isinstance(x, E.Op):
            if not (x.attr == "guard" or all(isinstance(a, (E.IndexVal, E.Const)) for a in x.args)):
                # (index selects and comparisons are not counted: code generation splits loops instead)
                if x.op in SPECIAL:
                    special += weight
                elif x.op not in ("cast",):
                    simple += weight
            stack.extend((a, enclosing, base) for a in x.args)
        elif isinstance(x, E.Reduce):
            a = x.var.atom()
            ext = float(evaluate(a.extent, env)) if isinstance(a, Var) else 1.0
            if not enclosing and inner is not None and inner not in free:
                weight /= row  # and all it computes
                base /= row
            steps += ext * weight
            stack.append((x.body, (*enclosing, (a, ext)) if a is not None else enclosing, base))
    return simple, special, steps


def node_stats(g: gs.Graph, an: Analysis, sizes: Mapping[str, int] | None = None) -> NodeStats:
    env = {s: NOMINAL_SIZE for s in an.sym_origin}
    env.update(sizes or {})
    st = NodeStats()
    for name, info in an.tensors.items():
        n = _numel(info.shape, env)
        st.numel[name] = n
        st.nbytes[name] = n * (np.dtype(info.dtype).itemsize if info.dtype else 4)
    for node in g.nodes:
        lowered = an.lowered.get(node.name)
        if isinstance(lowered, list) and lowered:
            lz = lowered[0]
            idx = tuple(var(f"_c{k}", d) for k, d in enumerate(lz.shape))
            inner = next((p.atom() for p in reversed(idx) if p.atom() is not None), None)
            try:
                st.ops[node.name] = _op_counts(lz.fn(idx), {**env, **{f"_c{k}": 0 for k in range(len(idx))}}, inner)
            except (KeyError, ZeroDivisionError):
                st.ops[node.name] = (1.0, 0.0, 0.0)
            out = lz.shape
            for t in node.inputs:
                tin = an.tensors.get(t.name) if t.name else None
                if tin is not None and tin.shape is not None and len(tin.shape) == len(out) and out and (
                        (tin.shape[-1].const == 1 or len(out) - 1 in tin.uniform) and out[-1].const != 1
                        and tin.shape[:-1] == out[:-1]):
                    st.row_broadcast[(node.name, t.name)] = True
        else:
            st.ops[node.name] = (1.0, 0.0, 0.0)
        if node.op == "Softmax" and node.name in st.ops and node.outputs:
            _softmax_stats(st, g, an, node)
    return st


# A fused Softmax whose exps are not shared (its output stored, or read by anything but MatMuls by constant
# weights) against onnxruntime's MLAS Softmax, measured at 1 thread: 238 vs 71-118 us for (4096, 8) after a Mul,
# 403 vs 140 us for (2400, 92), 1823 vs 1037 us for (33600, 17). Its operation counts are scaled by this factor, so
# the planner leaves it to onnxruntime.
STORED_SOFTMAX_FACTOR = 3.0


def _softmax_stats(st: NodeStats, g: gs.Graph, an: Analysis, node: gs.Node) -> None:
    """onnxruntime's costs of a Softmax beside evonnx's (`NodeStats`): each exp once and a cost per row for it;
    for a fused one, each exp once where they are shared (`shared_ops`), else `STORED_SOFTMAX_FACTOR` times its
    operations."""
    ops = st.ops[node.name]
    out = node.outputs[0]
    info = an.tensors.get(out.name)
    axis = int(node.attrs.get("axis", -1))
    row = info.shape[axis].const if info is not None and info.shape and -len(info.shape) <= axis < len(info.shape) \
        else None
    st.ort_rows[node.name] = st.numel.get(out.name, 0.0) / max(row or NOMINAL_SIZE, 1)
    # per element, whichever the axis: a step of the row's max, a subtraction, one exp, a step of the row's sum and
    # (onnxruntime) the scaling; over another axis than the last, evonnx's own count recomputes the row per element
    once = (3.0, 1.0, 2.0)
    st.ort_ops[node.name] = once
    st.ops[node.name] = (ops[0] * STORED_SOFTMAX_FACTOR, ops[1] * STORED_SOFTMAX_FACTOR, ops[2] * STORED_SOFTMAX_FACTOR)
    readers = [c for c in g.nodes if any(t.name == out.name for t in c.inputs)]
    rank = len(info.shape) if info is not None and info.shape else 0
    along = axis % rank if rank else -1
    if readers and all(_weighs_rows(c, out.name, along, rank, an, info.dtype if info else None) for c in readers):
        st.shared_ops[node.name] = once


def _weighs_rows(c: gs.Node, t: str, axis: int, rank: int, an: Analysis, dtype: str | None) -> bool:
    """Whether `c` contracts tensor `t` along `axis` with bounded constant weights (lower_reduce._dot's quotient):
    a MatMul reading it as A along its last axis, or a 1x1 Conv along its channels."""
    if len(c.inputs) < 2 or c.inputs[0].name != t or (c.op, axis) not in (("MatMul", rank - 1), ("Conv", 1)):
        return False
    weights = _known(an, c.inputs[1].name)
    if c.op == "Conv" and weights is not None:
        weights = weights.reshape(weights.shape[0], -1).T if weights.ndim >= 2 else None
    return weights_bounded(weights, dtype)


def _known(an: Analysis, name: str) -> np.ndarray | None:
    info = an.tensors.get(name)
    return info.known.array() if info is not None and info.known is not None else None


def _cache_file() -> str:
    import onnxruntime as ort

    key = f"v4-{platform.machine()}-{platform.processor() or 'cpu'}-{os.cpu_count()}-ort{ort.__version__}"
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in key)
    return str(cache_dir() / f"cost-model-{safe}.json")


def _median_us(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


_MICRO = r"""
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <time.h>
#define N 1024  /* three arrays of 4 KB: the loop runs from L1, so it measures arithmetic */
static float a[N], b[N], c[N];
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(void) {
    for (int i = 0; i < N; ++i) { a[i] = (float)i * 1e-3f; b[i] = 1.0001f; }
    double best_simple = 1e300, best_exp = 1e300, best_red = 1e300;
    for (int rep = 0; rep < 7; ++rep) {
        double t = now();
        for (int r = 0; r < 400; ++r) {
            for (int i = 0; i < N; ++i) c[i] = ((a[i] * b[i] + a[i]) - b[i] * 0.5f) * a[i] + b[i];  /* 6 ops */
            a[r % N] += c[N - 1] * 1e-30f;
        }
        t = now() - t;
        if (t < best_simple) best_simple = t;
        t = now();
        for (int r = 0; r < 80; ++r) {
            for (int i = 0; i < N; ++i) c[i] = expf(a[i]);
            a[r % N] += c[N - 1] * 1e-30f;
        }
        t = now() - t;
        if (t < best_exp) best_exp = t;
        t = now();
        float m = -1e30f;
        for (int r = 0; r < 400; ++r) {
#pragma omp simd reduction(max : m)
            for (int i = 0; i < N; ++i) m = a[i] > m ? a[i] : m;  /* a reduction step, as kernels emit it */
            a[r % N] += m * 1e-30f;
        }
        t = now() - t;
        if (t < best_red) best_red = t;
    }
    printf("%.6f %.6f %.6f\n", best_simple / (400.0 * N * 6), best_exp / (80.0 * N), best_red / (400.0 * N));
    return 0;
}
"""


def _kernel_speeds() -> tuple[float, float, float]:
    """ns per simple operation, per exp and per reduction step in loops built like the generated kernels (same
    compiler, same flags); numpy's speeds when no compiler is found (they include memory traffic)."""
    cc = c_compiler()
    if cc is not None:
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "micro.c"), os.path.join(d, "micro")
            with open(src, "w") as f:
                f.write(_MICRO)
            flags = [x for x in kernel_cflags(cc) if x not in ("-fPIC", "-fvisibility=hidden")]
            try:
                subprocess.run([cc, *flags, src, "-o", exe, "-lm"], check=True, capture_output=True, timeout=60)
                out = subprocess.run([exe], check=True, capture_output=True, text=True, timeout=60).stdout.split()
                return float(out[0]), float(out[1]), float(out[2])
            except (subprocess.SubprocessError, OSError, ValueError, IndexError) as e:
                log.warning("cost-model micro-benchmark failed (%s); using numpy's speeds", e)
    small = np.ones(1 << 14, np.float32)
    out_ = np.empty_like(small)
    add = _median_us(lambda: np.add(small, small, out=out_), 300) * 1e3 / small.size
    return add, _median_us(lambda: np.exp(small, out=out_), 300) * 1e3 / small.size, 4 * add


def _softmax_row_ns() -> float:
    """onnxruntime's Softmax per row beyond its elements: the same 65,536 floats as 4,096 rows of 16 and as 256
    rows of 256."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def session(shape: tuple[int, int]) -> tuple[ort.InferenceSession, dict[str, np.ndarray]]:
        graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return s, {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}

    (short, fs), (long_, fl) = session((4096, 16)), session((256, 256))
    for _ in range(20):
        short.run(None, fs)
        long_.run(None, fl)
    gap = _median_us(lambda: short.run(None, fs), 300) - _median_us(lambda: long_.run(None, fl), 300)
    return max(gap * 1e3 / (4096 - 256), 0.0)


def calibrate(*, use_cache: bool = True) -> CostModel:
    """Measure this machine's constants (about a second), cached per machine and onnxruntime version.
    `EVONNX_COST_MODEL=defaults` skips measuring (for reproducible plans in tests)."""
    if os.environ.get("EVONNX_COST_MODEL") == "defaults":
        return CostModel()
    path = _cache_file()
    if use_cache and os.path.exists(path):
        try:
            with open(path) as f:
                return CostModel(**json.load(f))
        except (OSError, ValueError, TypeError):
            log.info("ignoring unreadable cost model cache %s", path)
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def chain(n: int) -> ort.InferenceSession:
        nodes = [helper.make_node("Relu", [f"t{k}"], [f"t{k + 1}"]) for k in range(n)]
        graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 16])],
                                  [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1, 16])])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])

    simple_ns, special_ns, reduce_ns = _kernel_speeds()
    x = np.zeros((1, 16), np.float32)
    s1, s17 = chain(1), chain(17)
    for s in (s1, s17):
        for _ in range(200):
            s.run(None, {"t0": x})
    node_us = max((_median_us(lambda: s17.run(None, {"t0": x}), 2000) -
                   _median_us(lambda: s1.run(None, {"t0": x}), 2000)) / 16, 0.1)
    row_ns = _softmax_row_ns()
    big = np.ones(4 << 20, np.float32)  # 16 MB: beyond the caches
    dst = np.empty_like(big)
    copy_us = _median_us(lambda: np.copyto(dst, big), 30)
    model = CostModel(ort_node_us=round(node_us, 3), kernel_us=round(node_us * 1.5, 3),
                      ns_per_byte=round(copy_us * 1e3 / (2 * big.nbytes), 4), ns_per_op=round(simple_ns, 4),
                      ns_per_special=round(special_ns, 4), ns_per_reduce_step=round(reduce_ns, 4),
                      ort_row_ns=round(row_ns, 2), source="calibrated")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(asdict(model), f)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # gone after the rename; left only by a failure or Ctrl-C
    except OSError as e:
        log.info("cannot cache the cost model: %s", e)
    return model
