"""Timing onnxruntime sessions: the one mechanism behind the never-slower guard (`evonnx optimize`) and the
benchmarks (`benchmarks/cpu.py`, and `evonnx bench`).

`Runner` holds a session with its inputs bound; `interleaved` times several runners in rounds whose order rotates,
so that slow drift of the machine (frequency, other load) falls on all of them alike; `stats` gives the median
and p10/p90. `compare_models` times an original and its optimized model that way and says whether the optimized
one is slower (its median ratio below 0.98).
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evonnx.errors import VerificationError
from evonnx.isolate import doing, isolated, register_library

if TYPE_CHECKING:
    import onnxruntime as ort

MIN_RUNS = 50
MAX_RUNS = 200_000
WARMUP_RUNS = 10


class MeasureError(RuntimeError):
    """A model could not be timed (a session lacks inputs the feeds name, a run fails)."""


def stats(ns: Sequence[int]) -> dict[str, float]:
    a = np.asarray(ns, dtype=np.float64) / 1e3
    p10, p50, p90 = np.percentile(a, [10, 50, 90])
    return {"median_us": float(p50), "p10_us": float(p10), "p90_us": float(p90), "min_us": float(a.min()),
            "runs": int(a.size)}


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def median_ns(fn: Callable[[], object], runs: int) -> float:
    clock = time.perf_counter_ns
    ts = []
    for _ in range(runs):
        t0 = clock()
        fn()
        ts.append(clock() - t0)
    return float(np.median(ts))



def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says: for benchmark reports."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def session_options(threads: int, spin: bool = True) -> ort.SessionOptions:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


class Runner:
    """One session with its inputs pre-bound and its outputs preallocated; `call()` is what gets timed.

    api "iobinding": `sess.run_with_iobinding(binding)`, inputs bound once as OrtValues (shared by all sessions
    of a model), outputs bound to preallocated numpy buffers that onnxruntime writes into.
    api "run": `sess.run(None, feeds)`, onnxruntime allocates the outputs and returns new numpy arrays.
    """

    def __init__(self, label: str, sess: Any, feeds: Mapping[str, np.ndarray], ort_inputs: Mapping[str, Any],
                 out_templates: Mapping[str, np.ndarray], api: str) -> None:
        import onnxruntime as ort

        self.label = label
        self.sess = sess
        self.api = api
        names = [i.name for i in sess.get_inputs()]
        missing = [n for n in names if n not in feeds]
        if missing:
            raise MeasureError(f"{label}: the session wants inputs {missing} that the feeds do not hold")
        self.feeds = {n: feeds[n] for n in names}
        self.out_names = [o.name for o in sess.get_outputs()]
        self.outs: dict[str, np.ndarray] = {}
        self.binding = sess.io_binding()
        for n in names:
            self.binding.bind_ortvalue_input(n, ort_inputs[n])
        for n in self.out_names:
            buf = np.empty_like(out_templates[n])
            self.outs[n] = buf
            self.binding.bind_ortvalue_output(n, ort.OrtValue.ortvalue_from_numpy(buf))
        binding, run_feeds = self.binding, self.feeds  # closures over locals: no cycle keeps a session alive
        if api == "iobinding":
            self.call: Callable[[], object] = lambda: sess.run_with_iobinding(binding)
        else:
            self.call = lambda: sess.run(None, run_feeds)

    def outputs(self) -> dict[str, np.ndarray]:
        """Run once through the timed path and return its outputs (copies)."""
        if self.api == "iobinding":
            for buf in self.outs.values():
                buf.fill(0x5A if buf.dtype.kind in "biu" else np.nan)  # so an unwritten buffer cannot pass
            self.call()
            return {n: self.outs[n].copy() for n in self.out_names}
        return dict(zip(self.out_names, self.sess.run(None, self.feeds), strict=True))

    def timed(self, runs: int, into: list[int]) -> None:
        call, clock = self.call, time.perf_counter_ns
        for _ in range(runs):
            t0 = clock()
            call()
            into.append(clock() - t0)


def interleaved(runners: Sequence[Runner], repeats: Sequence[int], rounds: int) -> list[list[int]]:
    """Timed runs in `rounds` rounds; each round runs one block per runner, the order rotating every round.

    Each block starts with one untimed run, so no block is charged for the cache state the previous one left.
    """
    times: list[list[int]] = [[] for _ in runners]
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            order = list(range(len(runners)))
            order = order[r % len(order):] + order[:r % len(order)]
            if (r // len(order)) % 2:
                order.reverse()
            for k in order:
                done = len(times[k])
                block = math.ceil((repeats[k] - done) / (rounds - r))
                if block <= 0:
                    continue
                runners[k].call()
                runners[k].timed(block, times[k])
    finally:
        if gc_was:
            gc.enable()
    return times


def warm_up(runner: Runner, seconds: float) -> float:
    """At least WARMUP_RUNS runs (and about `seconds`); returns the median of the later half, in ns."""
    ts: list[int] = []
    t_end = time.perf_counter() + seconds
    while len(ts) < WARMUP_RUNS or (time.perf_counter() < t_end and len(ts) < 10_000):
        runner.timed(1, ts)
    return float(np.median(ts[len(ts) // 2:]))


def runs_for(est_ns: float, seconds: float) -> int:
    return int(min(MAX_RUNS, max(MIN_RUNS, math.ceil(seconds * 1e9 / max(est_ns, 1.0)))))


def cpu_snapshot() -> tuple[float, float, float] | None:
    """(busy CPU seconds of the whole machine, this process's CPU seconds, wall seconds); None off Linux."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = f
    t = os.times()
    return ((user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), t.user + t.system,
            time.perf_counter())


def other_load(a: tuple[float, float, float] | None, b: tuple[float, float, float] | None) -> float | None:
    """Cores kept busy by other processes (and hypervisor steal) between two snapshots."""
    if a is None or b is None or b[2] <= a[2]:
        return None
    return max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / (b[2] - a[2]))


# A ratio this close to 1 is a tie whatever the spread of the rounds: whole-model medians on a quiet machine move
# by about this much between runs (benchmarks/README.md).
NOISE_FLOOR = 0.02


@dataclass
class Comparison:
    """An original and its optimized model timed in one interleaved run (`compare_models`)."""

    threads: int
    original: dict[str, float]  # stats(): median_us, p10_us, p90_us, min_us, runs
    optimized: dict[str, float]
    ratio: float  # original median / optimized median: above 1 the optimized model is faster
    noise: float  # half the interquartile range of the per-round ratios, relative to the ratio

    @property
    def slower(self) -> bool:
        """The optimized model's median loses by more than NOISE_FLOOR. The spread of the rounds does not widen
        that margin: on a loaded machine (spread +-13 %) a kernel set measured at 0.886x would otherwise pass as a
        tie; a noisy measurement is timed again, longer (`guard.GUARD_RETIME_NOISE`), and what stays below 0.98x is
        left to onnxruntime. Never slower is the promise; a neutral kernel dropped on a noisy machine costs
        nothing."""
        return self.ratio < 1.0 - NOISE_FLOOR

    def __str__(self) -> str:
        threads = f"{self.threads} thread(s)" if self.threads else "onnxruntime's default threads"
        return (f"{self.ratio:.3f}x at {threads} (onnxruntime {self.original['median_us']:.0f} us, "
                f"evonnx {self.optimized['median_us']:.0f} us, noise +-{self.noise:.1%})")

    def as_dict(self) -> dict[str, Any]:
        return {"threads": self.threads, "ratio": self.ratio, "noise": self.noise, "slower": self.slower,
                "onnxruntime_us": self.original, "evonnx_us": self.optimized}


@isolated
def compare_models(original: bytes | str | Path, optimized: str | Path, library: str | Path,
                   feeds: Mapping[str, np.ndarray], *, threads: int = 1, seconds: float = 1.0,
                   rounds: int = 10) -> Comparison:
    """Time `original` (plain onnxruntime) against `optimized` with its kernel `library` on the CPU EP, at
    `threads` intra-op threads, about `seconds` of timed runs each, in `rounds` interleaved rounds."""
    import onnxruntime as ort

    def session(model: bytes | str | Path, lib: str | Path | None) -> Any:
        so = session_options(threads)
        so.log_severity_level = 4
        if lib is not None:
            register_library(so, lib)
        return ort.InferenceSession(model if isinstance(model, bytes) else str(model), so,
                                    providers=["CPUExecutionProvider"])

    doing("timing the original model")
    try:
        ref_sess = session(original, None)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types
        # a model with another library's custom ops, optimized with --no-check: nothing to time against
        raise MeasureError(f"onnxruntime cannot load the original model: {str(e).splitlines()[0][:200]}") from e
    try:
        ref_out = ref_sess.run(None, dict(feeds))
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types
        raise MeasureError(f"onnxruntime cannot run the original model on these inputs: {e}") from e
    templates = dict(zip([o.name for o in ref_sess.get_outputs()], ref_out, strict=True))
    # np.asarray keeps a 0-d input 0-d (ascontiguousarray makes it [1]: a scalar input failed the kernel's rank check)
    ort_inputs = {k: ort.OrtValue.ortvalue_from_numpy(np.asarray(v, order="C")) for k, v in feeds.items()}
    doing("timing the optimized model")
    try:
        opt_sess = session(optimized, library)
        opt_sess.run(None, dict(feeds))
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types
        # the original runs on these inputs: an optimized model that does not is wrong, not merely slow
        raise VerificationError(f"the optimized model fails where the original runs (timing inputs): "
                                f"{str(e).splitlines()[0][:200]}") from e
    runners = [Runner("onnxruntime", ref_sess, feeds, ort_inputs, templates, "iobinding"),
               Runner("evonnx", opt_sess, feeds, ort_inputs, templates, "iobinding")]
    est = [warm_up(r, min(0.2, seconds / 4)) for r in runners]
    # about `seconds` each, and at least one run per round (a slow model gets fewer than MIN_RUNS)
    repeats = [max(rounds, min(MAX_RUNS, int(seconds * 1e9 / max(e, 1.0)))) for e in est]
    times = interleaved(runners, repeats, rounds)
    per_round = [[float(np.median(c)) for c in np.array_split(np.asarray(t, np.float64), rounds) if len(c)]
                 for t in times]
    ratios = np.asarray(per_round[0]) / np.asarray(per_round[1])
    s_orig, s_opt = stats(times[0]), stats(times[1])
    ratio = s_orig["median_us"] / s_opt["median_us"]
    q1, q3 = np.percentile(ratios, [25, 75]) if ratios.size else (ratio, ratio)
    del runners
    gc.collect()  # free both sessions and their thread pools now
    return Comparison(threads, s_orig, s_opt, ratio, float((q3 - q1) / 2 / ratio))


@dataclass
class NodeProfile:
    """onnxruntime's profiler on one model (`profile_nodes`): per node of the graph onnxruntime ran (after its own
    optimizations: a node it fused away has no entry, the fused node has a name of its own), the median kernel
    time over the profiled runs, and the median of their sum."""

    times_us: dict[str, float]
    ops: dict[str, str]
    total_us: float


@isolated
def profile_nodes(model: bytes | str | Path, library: str | Path | None, feeds: Mapping[str, np.ndarray], *,
                  threads: int = 1, runs: int = 20, warmup: int = 3) -> NodeProfile:
    """Profile `model` (with its kernel `library`, if any) on the CPU EP with onnxruntime's own profiler: `warmup`
    runs, then `runs` profiled ones. The profile file is removed."""
    import json
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="evonnx-profile-") as tmp:
        so = session_options(threads)
        so.log_severity_level = 4
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "profile")
        if library is not None:
            register_library(so, library)
        doing("profiling the " + ("optimized" if library is not None else "original") + " model")
        try:
            sess = ort.InferenceSession(model if isinstance(model, bytes) else str(model), so,
                                        providers=["CPUExecutionProvider"])
            for _ in range(warmup + runs):
                sess.run(None, dict(feeds))
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types
            raise MeasureError(f"cannot profile the model: {str(e).splitlines()[0][:200]}") from e
        events = json.loads(Path(sess.end_profiling()).read_text())
    per_node: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    for ev in events:
        name = ev.get("name", "")
        if ev.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        node = name[: -len("_kernel_time")]
        per_node.setdefault(node, []).append(float(ev.get("dur", 0)))
        ops[node] = ev.get("args", {}).get("op_name", "")
    times = {n: float(np.median(d[warmup:] if len(d) > warmup else d)) for n, d in per_node.items()}
    # one event per node and run, in run order: the k-th event of every node belongs to run k
    sums = [sum(d[k] for d in per_node.values() if k < len(d)) for k in range(warmup, warmup + runs)]
    return NodeProfile(times, ops, float(np.median(sums)) if sums else 0.0)
