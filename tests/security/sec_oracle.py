"""The oracle of the security tests: optimize a case and run it next to onnxruntime, all in child processes.

`check_case` returns an `Outcome` whose `findings` are one-line descriptions of everything that went wrong:
- optimize raised anything but an `EvonnxError` (a clean refusal is no finding), or its process died;
- evonnx's own check refused the optimized model (it differed, failed or crashed where the original ran);
- model text escaped into the generated C (`sec_payloads.check_source`), or the canary marker file appeared while
  optimizing or when a fresh process loaded and ran the library;
- a run of the optimized model crashed, hung, or reported a sanitizer error;
- at some sizes the optimized model returned a result where onnxruntime errors, errored where onnxruntime
  returns one, or returned other values, shapes or types (exact for integer, bool and exact float outputs;
  rtol 1e-4 otherwise, float16 4e-3 (`evonnx.verify.RTOL`); NaN == NaN).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from sec_cases import Case, make_feeds
from sec_excuses import REUSE_ERROR, _error_in_dead_node, cut_model, decision_cuts, with_outputs
from sec_payloads import check_source

from evonnx.api import library_path
from evonnx.model import HALF_MOVES, half_precision_outputs
from evonnx.references import first_nan_reference
from evonnx.verify import (
    ATOL_SCALE,
    HALF_OVERFLOW,
    RTOL,
    CheckResult,
    _closer_than_onnxruntime,
    _undefined_in_onnxruntime,
    signed_zero_outputs,
)

HERE = Path(__file__).resolve().parent
CHILD = HERE / "sec_child.py"
OPTIMIZE_TIMEOUT = 240
RUN_TIMEOUT = 120
# A child's address space is capped (sec_child.py), so that a runaway allocation fails instead of exhausting the
# machine; not under ASan, which reserves terabytes of shadow address space.
MEMORY_LIMIT = 6 << 30
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer", "UndefinedBehaviorSanitizer")


@dataclass
class Outcome:
    findings: list[str] = field(default_factory=list)
    status: str = ""  # optimize: ok / refused / exception / crashed
    fused: int = 0  # Fused nodes in the optimized model
    runs_compared: int = 0  # plans where both models gave outputs
    runs_both_failed: int = 0
    note: str = ""
    # why optimize left kernels to onnxruntime whose outputs differed at its check (evonnx.blame): no wrong model
    # was written, but a kernel differed from onnxruntime on a valid graph; the long run keeps these cases
    blamed: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)  # sanitizer reports and deaths of runs (also in findings)

    def crash(self, text: str) -> None:
        self.crashes.append(text)
        self.findings.append(text)

    @property
    def says_something(self) -> bool:
        """The case exercised generated code: a Fused node exists (or a finding was made)."""
        return bool(self.findings) or self.fused > 0


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("EVONNX_COST_MODEL", "defaults")
    env.setdefault("EVONNX_GUARD", "0")  # the oracle compares results; the guard only times (tests/test_guard.py)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    # The optimize child is a process of its own already; evonnx's worker process (evonnx/isolate.py) would cost
    # each case a second Python start-up. A crash without it is looked at again with it (`optimize_case`).
    env.setdefault("EVONNX_ISOLATE", "0")
    env.setdefault("EVONNX_DEBUG", "1")  # a lowering that fails other than by Reject is a finding, not a refusal
    env.update(extra or {})
    if "LD_PRELOAD" not in env:
        env["EVONNX_SEC_MEMORY_LIMIT"] = str(MEMORY_LIMIT)
    return env


_IDLE: dict[tuple[tuple[str, str], ...], list[subprocess.Popen]] = {}  # idle fork servers by environment
_IDLE_LOCK = threading.Lock()
_MAX_IDLE = 8  # servers kept idle in all: a few environments (the fuzz's two planners) times the jobs


def _checkout(env: Mapping[str, str]) -> subprocess.Popen | None:
    """An idle fork server (sec_child.py serve) for children run with `env`, or a new one; None where a fresh
    process is needed: under a sanitizer (LD_PRELOAD), or with EVONNX_SEC_FORK_SERVER=0. Servers are shared by
    the threads that check cases and kept per environment: the fuzz alternates planners (EVONNX_SEC_PLANNER), and
    a server restarted at every change cost each case a Python start-up. Checked out by one thread at a time and
    handed back (`_checkin`), so there are never more than the cases checked at once need: a server per thread
    outlived its thread, and a long run's new threads for every chunk piled up hundreds of them."""
    if "LD_PRELOAD" in env or os.environ.get("EVONNX_SEC_FORK_SERVER") == "0":
        return None
    key = tuple(sorted(env.items()))
    with _IDLE_LOCK:
        idle = _IDLE.get(key, [])
        while idle:
            proc = idle.pop()
            if proc.poll() is None:
                return proc
    proc = subprocess.Popen([sys.executable, str(CHILD), "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=dict(env), cwd=tempfile.gettempdir(), text=True)
    with _IDLE_LOCK:
        _ALL_SERVERS.append(proc)
    return proc


def _checkin(env: Mapping[str, str], proc: subprocess.Popen) -> None:
    """Hands `proc` back for the next child with `env`; stops the oldest idle server beyond `_MAX_IDLE`."""
    surplus: list[subprocess.Popen] = []
    with _IDLE_LOCK:
        _IDLE.setdefault(tuple(sorted(env.items())), []).append(proc)
        while sum(len(v) for v in _IDLE.values()) > _MAX_IDLE:
            oldest = next(v for v in _IDLE.values() if v)
            surplus.append(oldest.pop(0))
        for k in [k for k, v in _IDLE.items() if not v]:
            del _IDLE[k]
    for p in surplus:
        _stop(p)


_ALL_SERVERS: list[subprocess.Popen] = []


def _stop(proc: subprocess.Popen) -> None:
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()


atexit.register(lambda: [_stop(p) for p in _ALL_SERVERS])


def _run_child(args: Sequence[str], cwd: Path, timeout: float, env: Mapping[str, str]) -> tuple[int | None, str]:
    """(return code or None on timeout, stderr tail)."""
    proc = _checkout(env)
    if proc is not None and proc.stdin is not None and proc.stdout is not None:
        err_file = cwd / f"child-{args[0]}.stderr"
        try:
            proc.stdin.write(json.dumps({"argv": list(args), "cwd": str(cwd), "stderr": str(err_file),
                                         "timeout": timeout}) + "\n")
            proc.stdin.flush()
            answer = proc.stdout.readline()
        except OSError:
            answer = ""
        if answer:
            _checkin(env, proc)
            rc = json.loads(answer)["rc"]
            err = err_file.read_text(errors="replace") if err_file.is_file() else ""
            err_file.unlink(missing_ok=True)
            return rc, err
        _stop(proc)  # the server itself died (it never should): a fresh child instead
    try:
        p = subprocess.run([sys.executable, str(CHILD), *args], cwd=cwd, env=dict(env), capture_output=True,
                           text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, err
    return p.returncode, p.stderr or ""  # whole: a sanitizer report starts long before its end


def _describe_rc(rc: int | None) -> str:
    if rc is None:
        return "timed out"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited {rc}"


def _sanitizer_report(stderr: str) -> str | None:
    """The first line of a sanitizer report, with the first frame of ours (a kernel or the runtime) if any."""
    lines = stderr.splitlines()
    for k, line in enumerate(lines):
        if any(m in line for m in SANITIZER_MARKERS):
            frame = next((f.strip() for f in lines[k:k + 40] if re.search(r"#\d+ .*(evo|kernels\.c)", f)), "")
            return (line.strip()[:240] + (f" | {frame[:200]}" if frame else ""))
    return None


def optimize_case(src: Path, dst: Path, dump: Path, work: Path, env: Mapping[str, str], outcome: Outcome,
                  shapes: Mapping[str, Sequence[int]] | None = None) -> dict | None:
    """Runs the optimize child; records findings; returns its result dict when it completed."""
    result = work / "optimize.json"
    extra = [json.dumps({k: list(v) for k, v in shapes.items()})] if shapes else []
    args = ["optimize", str(src), str(dst), str(dump), str(result), *extra]
    rc, err = _run_child(args, work, OPTIMIZE_TIMEOUT, env)
    if not result.is_file() and env.get("EVONNX_ISOLATE") == "0":
        # Died without the worker: onnxruntime crashing on the model is a clean refusal with it, so ask again as a
        # user's process runs. What still dies, or now raises, is judged below.
        shutil.rmtree(dump, ignore_errors=True)
        rc, err = _run_child(args, work, OPTIMIZE_TIMEOUT, {**env, "EVONNX_ISOLATE": "1"})
    if not result.is_file():
        outcome.status = "crashed"
        tail = err.strip().splitlines()[-1:] if err.strip() else []
        outcome.findings.append(f"optimize: the process {_describe_rc(rc)} ({'; '.join(tail)[:300]})")
        return None
    res = json.loads(result.read_text())
    judge_optimize(res, outcome)
    return res


def judge_optimize(res: dict, outcome: Outcome) -> None:
    """Records in `outcome` what the optimize child's result `res` says: its status, its findings (an exception,
    an internal error, C that does not build, the check refusing the optimized model) or why it refused cleanly."""
    outcome.status = res["status"]
    if res["status"] == "exception":
        last = res["traceback"].strip().splitlines()
        where = [ln.strip() for ln in last if ln.strip().startswith("File ")][-1:] or [""]
        outcome.findings.append(f"optimize raised {res['type']} (not an EvonnxError): {res['message'][:200]!r} "
                                f"at {where[0][:200]}")
    elif res["status"] == "refused" and res["type"] == "InternalError":
        # a broken invariant (with EVONNX_DEBUG, a lowering that raised anything but Reject): evonnx's bug
        outcome.findings.append(f"optimize: internal error: {res['message'][:300]}")
    elif res["status"] == "refused" and res["type"] == "BuildError":
        # Generated C that does not compile is evonnx's bug, and with model text in it, text reaching the compiler.
        first = res["message"].split("\n")
        errors = [ln for ln in first if "error" in ln][:2]
        outcome.findings.append(f"optimize: the generated C does not build: {first[0][:160]} "
                                f"{' | '.join(errors)[:300]}")
    elif res["status"] == "refused" and "VerificationError" in res.get("kinds", [res["type"]]) \
            and not res["message"].startswith(("cannot check", "onnxruntime rejects your inputs")) \
            and not _planner_refusal(res["message"]):
        # evonnx's own check caught its optimized model failing, crashing or differing: no wrong model was written,
        # but the kernels or the plan have a bug, found at the check's sizes. Every subclass counts (OutputMismatch,
        # KernelFailure, UnloadableModel ...): matching the base class's name alone let them pass as clean refusals.
        outcome.findings.append(f"optimize: evonnx's check refused its own optimized model: {res['message'][:300]}")
    elif res["status"] == "refused":
        outcome.note = f"refused: {res['type']}: {res['message'][:300]}"
    else:
        outcome.fused = res["fused"]
        outcome.blamed = list(res.get("blamed", []))


def check_marker(marker: Path, when: str, outcome: Outcome) -> None:
    if marker.exists():
        outcome.findings.append(f"code from a model name ran: the canary marker file appeared {when}")
        marker.unlink()


def _write_feeds(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """`arrays` as the child reads them: an .npz and the input names next to it."""
    np.savez(path, *arrays.values())
    Path(str(path) + ".names").write_text(json.dumps({f"arr_{i}": n for i, n in enumerate(arrays)}))


def _run_spec(runs: list[dict], work: Path, env: Mapping[str, str], *, arena: bool = True,
              malloc_inputs: bool = False) -> tuple[int | None, str, list[str]]:
    """Runs `runs` in one child; (return code, stderr tail, labels of the runs the child started)."""
    spec = work / "run.json"
    progress = work / "progress.txt"
    progress.unlink(missing_ok=True)
    spec.write_text(json.dumps({"runs": runs, "progress": str(progress), "arena": arena,
                                "malloc_inputs": malloc_inputs}))
    rc, err = _run_child(["run", str(spec)], work, RUN_TIMEOUT, env)
    started = progress.read_text().split("\n") if progress.is_file() else []
    return rc, err, [s for s in started if s]


def run_models(feeds: Sequence[tuple[str, Mapping[str, np.ndarray]]], original: Path, optimized: Path | None,
               library: Path | None, work: Path, env: Mapping[str, str], *, arena: bool = True,
               malloc_inputs: bool = False, x0ref: Path | None = None) -> tuple[list[dict], int | None, str, list[str]]:
    """Runs the original (plain onnxruntime) and then the optimized model on every (label, feeds) in one child
    (and `x0ref`, the original with lane-independent NaN rules in its reductions, see
    `evonnx.references.first_nan_reference`).

    Returns (runs, return code, stderr tail, labels of the runs the child started)."""
    runs = []
    for k, (label, arrays) in enumerate(feeds):
        path = work / f"feeds{k}.npz"
        _write_feeds(path, arrays)
        runs.append({"label": f"original/{k}", "model": str(original), "library": None, "feeds": str(path),
                     "out": str(work / f"original{k}"), "threads": 1, "plan": label})
        runs.append({"label": f"unoptimized/{k}", "model": str(original), "library": None, "feeds": str(path),
                     "out": str(work / f"unoptimized{k}"), "threads": 1, "plan": label, "optimize": False})
        if x0ref is not None:
            runs.append({"label": f"x0ref/{k}", "model": str(x0ref), "library": None, "feeds": str(path),
                         "out": str(work / f"x0ref{k}"), "threads": 1, "plan": label})
    if optimized is not None:
        for k, (label, _) in enumerate(feeds):
            runs.append({"label": f"optimized/{k}", "model": str(optimized), "library": str(library),
                         "feeds": str(work / f"feeds{k}.npz"), "out": str(work / f"optimized{k}"), "threads": 2,
                         "plan": label})
    rc, err, started = _run_spec(runs, work, env, arena=arena, malloc_inputs=malloc_inputs)
    return runs, rc, err, started


def case_feeds(case: Case) -> list[tuple[str, dict[str, np.ndarray]]]:
    return [(plan_text(p), make_feeds(case.inputs, dict(p), case.value_regime, case.seed + k))
            for k, p in enumerate(case.plans)]


# np.load parses each array's header with ast.literal_eval, and CPython 3.11.7's parser is not safe across threads
# ("SystemError: AST constructor recursion depth mismatch" ended a long run whose chunks judge cases on threads)
_LOAD_LOCK = threading.Lock()


def _load(out: str) -> tuple[list[np.ndarray] | None, str | None]:
    if Path(out + ".npz").is_file():
        try:
            with _LOAD_LOCK, np.load(out + ".npz") as z:
                return [z[f"arr_{i}"] for i in range(len(z.files))], None
        except (EOFError, OSError, ValueError):
            # cut short: the child died while writing it (a timeout), which judge_runs reports from its exit
            # status; the long run crashed here once, after its processes had been paused and resumed
            return None, None
    if Path(out + ".err").is_file():
        # bytes, not text: text mode would turn a "\r\n" inside a node name into "\n" (_error_in_dead_node)
        return None, Path(out + ".err").read_bytes().decode("utf-8", errors="replace")
    return None, None


def plan_text(plan: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{_short(k)}={v}" for k, v in plan.items()) + "}" if plan else "static sizes"


def _short(text: str, limit: int = 20) -> str:
    r = repr(text)[1:-1]
    return r if len(r) <= limit else r[: limit - 3] + "..."


def exactness(model: onnx.ModelProto, exact: bool) -> list[bool | str]:
    """How `compare` compares each graph output of a case: False (within tolerance), True (bit for bit, zero signs
    included; NaN payloads aside) or "values" (bit for bit but +0 == -0) for an output that an op in
    ZERO_SIGN_UNDEFINED computes (`evonnx.verify.signed_zero_outputs`, the product check's own rule)."""
    signed = signed_zero_outputs(model)
    # A float16 result of arithmetic is onnxruntime's to within float16's rounding only: where it rounds inside a
    # chain depends on where its graph optimizations leave the Casts it puts around float16 ops (fuzz case 2554:
    # Sub -> Gather -> Transpose -> Mul rounds after each op at ORT_DISABLE_ALL, once at ORT_ENABLE_ALL), and
    # evonnx's check compares such outputs within that tolerance too (`evonnx.expr.is_exact`: one op rounded once
    # stays exact, so only where two ops or more may compute it)
    computes = sum(n.op_type not in _MOVES for n in model.graph.node) >= 2
    # and an output of another float type computed through float16 arithmetic is onnxruntime's to within float16's
    # rounding too, since where it drops its own Casts to float16 depends on the whole graph (fuzz case 2118:
    # Exp(float16) -> Cast(float32) is never rounded to float16), as evonnx's check has it (`half_precision_outputs`)
    half = half_precision_outputs(model)
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16}
    return ["half" if o.name in half and o.type.tensor_type.elem_type in floats
            else False if not exact or (computes and o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16)
            else True if o.name in signed else "values" for o in model.graph.output]


# ops that move float16 bits without rounding them (the product's list), and the constants
_MOVES = HALF_MOVES | {"Constant", "ConstantOfShape"}


def _planner_refusal(message: str) -> bool:
    """Whether evonnx's check refused the optimized model because onnxruntime's memory planner failed a node it
    runs itself (not a kernel): a buffer planned for a reduction's static shape, re-used for another whose
    empty-input quirk gives another shape (`sec_excuses.REUSE_ERROR`; fuzz case 210: ReduceMean(x, [-1, -2, -3])
    of an empty slice next to one of a full tensor). The original runs or fails by its own plan of another graph;
    refusing such a model is the product's right answer, not a finding."""
    return REUSE_ERROR in message and "running Fused node" not in message


def compare(ref: np.ndarray, got: np.ndarray, exact: bool | str) -> str | None:
    """None when `got` matches onnxruntime's `ref` as `exact` says (see `exactness`), else what differs."""
    if ref.dtype != got.dtype or ref.shape != got.shape:
        return f"gives {got.dtype}{list(got.shape)}, onnxruntime {ref.dtype}{list(ref.shape)}"
    if (exact and exact != "half") or ref.dtype.kind != "f":
        if ref.dtype.kind == "f":
            same = ref == got
            if exact != "values":
                same &= np.signbit(ref) == np.signbit(got)
            same |= np.isnan(ref) & np.isnan(got)
        else:
            same = ref == got
        if same.all():
            return None
        bad = np.argwhere(~same)
    else:
        finite = np.isfinite(ref)
        scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 1.0
        with np.errstate(all="ignore"):
            half = ref.dtype == np.float16 or exact == "half"  # the product check's float16 tolerance
            rtol, atol = (RTOL["float16"], ATOL_SCALE["float16"]) if half else (1e-4, 1e-5)
            ok = np.isclose(got, ref, rtol=rtol, atol=atol * max(scale, 1.0), equal_nan=True)
            if half:  # a float beyond float16's range rounds to an infinity of its sign (the check's rule)
                ok |= np.isinf(got) & (np.abs(ref) >= HALF_OVERFLOW) & (np.signbit(got) == np.signbit(ref))
        if ok.all():
            return None
        bad = np.argwhere(~ok)
    first = tuple(int(i) for i in bad[0]) if ref.ndim else ()
    return (f"differs at {len(bad)} of {ref.size} positions, first {list(first)}: evonnx {got[first]!r}, "
            f"onnxruntime {ref[first]!r}")


# onnxruntime's messages where an allocation fails
_OUT_OF_MEMORY = ("BFCArena::AllocateRawInternal", "Failed to allocate memory", "bad_alloc")


def _second_look(case: Case, runs: list[dict], work: Path, env: Mapping[str, str]) -> list[dict]:
    """Reference runs for the differences the first comparison found that onnxruntime itself can explain:
    - `noreuse/k`: the original with buffer re-use off, where onnxruntime failed with `REUSE_ERROR`;
    - `cutref/k`: for inexact cases with decision nodes, the original with each decision node fed evonnx's value
      of its float inputs (from the model optimized with those tensors as extra outputs), made only where
      evonnx's values are within the float tolerance of onnxruntime's;
    - `alone/k`: the optimized run again, alone in a child of its own, where onnxruntime failed to allocate memory
      in it (`_OUT_OF_MEMORY`): the first child ran the original's sessions before it under the same cap on its
      address space, and their arenas keep what they took (fuzz case 2291: a Gather left to onnxruntime, 1 GB at
      M = 4099, failed in the optimized model's session only).
    Returns the runs done (their outputs under `work`/second)."""
    by_label = {r["label"]: r for r in runs}
    second = work / "second"
    second.mkdir(exist_ok=True)
    extra: list[dict] = []
    for label, run in by_label.items():
        if label.startswith("original/"):
            _, err = _load(run["out"])
            if err and REUSE_ERROR in err:
                k = label.split("/")[1]
                extra.append({**run, "label": f"noreuse/{k}", "out": str(second / f"noreuse{k}"), "reuse": False})
    for label, run in by_label.items():
        _, err = _load(run["out"]) if label.startswith("optimized/") else (None, None)
        if err and any(m in err for m in _OUT_OF_MEMORY):
            k = label.split("/")[1]
            alone = {**run, "label": f"alone/{k}", "out": str(second / f"alone{k}")}
            (second / f"alone{k}").mkdir(exist_ok=True)
            _run_spec([alone], second / f"alone{k}", env)
            extra.append(alone)
    cuts = [] if case.exact else decision_cuts(case.model)
    if cuts:
        original = [r for r in runs if r["label"].startswith("original/")]
        extra += _cut_runs(case, cuts, original, second, env)
    if extra:
        _run_spec(extra, second, env)
    return extra


def _cut_runs(case: Case, cuts: list[str], original: list[dict], second: Path,
              env: Mapping[str, str]) -> list[dict]:
    """The `cutref/k` runs of `_second_look` (not yet run)."""
    src = second / "cuts.onnx"
    onnx.save(with_outputs(case.model, cuts), str(src))
    dst = second / "out" / "cuts.opt.onnx"
    dst.parent.mkdir(exist_ok=True)
    res = optimize_case(src, dst, second / "dump", second, env, Outcome())
    if res is None or res["status"] != "ok":
        return []
    runs = []
    for r in original:
        k = r["label"].split("/")[1]
        runs.append({**r, "label": f"cutorig/{k}", "model": str(src), "out": str(second / f"cutorig{k}")})
        runs.append({**r, "label": f"cutopt/{k}", "model": str(dst), "library": str(library_path(dst)),
                     "out": str(second / f"cutopt{k}"), "threads": 2})
    _run_spec(runs, second, env)
    reference, names = cut_model(case.model, cuts)
    ref_path = second / "cutref.onnx"
    onnx.save(reference, str(ref_path))
    n_out = len(case.model.graph.output)
    out = []
    for r in original:
        k = r["label"].split("/")[1]
        ort_values, _ = _load(str(second / f"cutorig{k}"))
        evo_values, _ = _load(str(second / f"cutopt{k}"))
        if ort_values is None or evo_values is None:
            continue
        if any(compare(a, b, False) for a, b in zip(ort_values[n_out:], evo_values[n_out:])):
            continue  # evonnx's inexact values themselves differ: no excuse
        with _LOAD_LOCK, np.load(r["feeds"]) as z:
            arrays = {n: z[a] for a, n in json.loads(Path(r["feeds"] + ".names").read_text()).items()}
        arrays.update(zip(names, evo_values[n_out:]))
        feeds = second / f"cutfeeds{k}.npz"
        _write_feeds(feeds, arrays)
        out.append({**r, "label": f"cutref/{k}", "model": str(ref_path), "feeds": str(feeds),
                    "out": str(second / f"cutref{k}")})
    return out


def _same_outcome(ref: list[np.ndarray] | None, ref_err: str | None, got: list[np.ndarray] | None,
                  exact: Sequence[bool | str]) -> bool:
    if ref is None or got is None:
        return ref is None and got is None and ref_err is not None
    return len(ref) == len(got) and all(compare(r, g, e) is None for r, g, e in zip(ref, got, exact))


def _model_and_feeds(original_run: dict) -> tuple[onnx.ModelProto, dict[str, np.ndarray]] | None:
    """The original model and the feeds of one of its runs, or None where they are not on disk."""
    feeds_path = original_run.get("feeds", "")
    if not feeds_path or not Path(feeds_path).is_file() or not Path(original_run["model"]).is_file():
        return None
    names = json.loads(Path(feeds_path + ".names").read_text())
    with _LOAD_LOCK, np.load(feeds_path) as z:
        feeds = {names[k]: z[k] for k in z.files}
    return onnx.load(original_run["model"]), feeds


def _differing(ref: list[np.ndarray], got: list[np.ndarray]) -> list[int]:
    return [k for k, (r, g) in enumerate(zip(ref, got)) if r.shape != g.shape or r.tobytes() != g.tobytes()]


def _from_a_concat_of_empties(original_run: dict, ref: list[np.ndarray], got: list[np.ndarray]) -> bool:
    """Whether every output that differs is computed from a Concat whose inputs are all empty but whose output is
    not, which onnxruntime fills from memory it never wrote (`evonnx.verify._undefined_in_onnxruntime`, the check's
    own excuse; fuzz seed 280022)."""
    loaded = _model_and_feeds(original_run) if len(ref) == len(got) else None
    if loaded is None:
        return False
    model, feeds = loaded
    differing = _differing(ref, got)
    return bool(differing) and all(
        ref[k].shape == got[k].shape and _undefined_in_onnxruntime(model, model.graph.output[k].name, feeds, ref[k],
                                                                   got[k], CheckResult()) for k in differing)


def _closer_to_float64(original_run: dict, ref: list[np.ndarray], got: list[np.ndarray],
                       exact: Sequence[bool | str]) -> bool:
    """Whether every output that differs is an inexact float32 one where evonnx's value is at least as close to the
    original model computed in float64 as onnxruntime's own (`evonnx.verify._closer_than_onnxruntime`, the check's
    own rule): a float32 sum of 720,000 values near -10,679 in onnxruntime's order is 5e-4 off the float64 sum,
    beyond the tolerance, where evonnx's double accumulator is 6e-7 off (fuzz case 2655, seed 400061)."""
    loaded = _model_and_feeds(original_run) if len(ref) == len(got) == len(exact) else None
    if loaded is None:
        return False
    model, feeds = loaded
    differing = _differing(ref, got)
    return bool(differing) and all(
        exact[k] is False and ref[k].shape == got[k].shape and ref[k].dtype == np.float32
        and _closer_than_onnxruntime(model, model.graph.output[k].name, feeds, ref[k], got[k], CheckResult())
        for k in differing)


def judge_runs(exact: Sequence[bool | str], runs: list[dict], rc: int | None, err: str, started: list[str],
               outcome: Outcome, what: str = "") -> None:
    sanitizer = _sanitizer_report(err)
    if sanitizer:
        run = next((r for r in runs if started and r["label"] == started[-1]), None)
        outcome.crash(f"{what}sanitizer: {sanitizer} (during {started[-1] if started else '?'}"
                               f"{' at ' + run['plan'] if run else ''})")
    died = rc != 0 and "done" not in started
    if died:
        last = started[-1] if started else "start-up"
        if last.startswith(("original", "unoptimized", "x0ref")):
            outcome.note += f" onnxruntime itself died on the original ({_describe_rc(rc)})"
        elif not sanitizer:
            run = next((r for r in runs if r["label"] == last), None)
            plan = run["plan"] if run else "?"
            tail = err.strip().splitlines()[-1:] if err.strip() else []
            outcome.crash(f"{what}the optimized model's process {_describe_rc(rc)} at {plan} "
                          f"({'; '.join(tail)[:200]})")
    by_label = {r["label"]: r for r in runs}
    for label, run in by_label.items():
        if not label.startswith("optimized/"):
            continue
        k = label.split("/")[1]
        ref, ref_err = _load(by_label[f"original/{k}"]["out"])
        got, got_err = _load(run["out"])
        plan = run["plan"]
        if ref is None and ref_err is None:
            continue  # the original did not run (onnxruntime died)
        if got is None and got_err is None:
            continue  # the optimized run never completed: reported above
        if got is None and f"alone/{k}" in by_label:  # out of memory after the original's sessions (_second_look)
            got, got_err = _load(by_label[f"alone/{k}"]["out"])
            outcome.note += f" at {plan} the optimized model ran out of memory after onnxruntime's own sessions, and " \
                            f"was run again alone"
        original_run = by_label[f"original/{k}"]
        if not _same_outcome(ref, ref_err, got, exact):
            # onnxruntime's graph optimizations change what some models do at edge sizes (e.g. a Reshape that
            # copies a dim the input lacks fails as written and succeeds once optimized away): matching
            # onnxruntime on the graph as written is matching onnxruntime.
            plain, plain_err = _load(by_label[f"unoptimized/{k}"]["out"]) if f"unoptimized/{k}" in by_label \
                else (None, None)
            if (plain is not None or plain_err is not None) and _same_outcome(plain, plain_err, got, exact):
                outcome.note += f" at {plan} evonnx matches onnxruntime without graph optimizations"
                outcome.runs_compared += 1
                continue
            if f"x0ref/{k}" in by_label and _same_outcome(*_load(by_label[f"x0ref/{k}"]["out"]), got, exact) \
                    and ref is not None:
                outcome.note += f" at {plan} evonnx matches onnxruntime with its ReduceMax/Min NaN rule made " \
                                f"lane-independent"
                outcome.runs_compared += 1
                continue
            if ref is None and ref_err and REUSE_ERROR in ref_err and f"noreuse/{k}" in by_label:
                noreuse, noreuse_err = _load(by_label[f"noreuse/{k}"]["out"])
                # with re-use off the original may run into a Concat of empties, whose bytes are its own (case 202)
                if _same_outcome(noreuse, noreuse_err, got, exact) or (
                        noreuse is not None and got is not None
                        and _from_a_concat_of_empties(original_run, noreuse, got)):
                    outcome.note += f" at {plan} onnxruntime's buffer re-use fails the original; evonnx matches " \
                                    f"it with re-use off"
                    outcome.runs_compared += 1
                    continue
            if f"cutref/{k}" in by_label and _same_outcome(*_load(by_label[f"cutref/{k}"]["out"]), got, exact):
                outcome.note += f" at {plan} evonnx matches onnxruntime fed evonnx's own float inputs (within " \
                                f"tolerance of onnxruntime's) to its comparisons, casts and roundings"
                outcome.runs_compared += 1
                continue
            if ref is not None and got is not None and _from_a_concat_of_empties(original_run, ref, got):
                outcome.note += f" at {plan} onnxruntime fills a Concat of empty inputs from memory it never wrote"
                outcome.runs_compared += 1
                continue
            if ref is not None and got is not None and _closer_to_float64(original_run, ref, got, exact):
                outcome.note += f" at {plan} evonnx is closer than onnxruntime to the model computed in float64"
                outcome.runs_compared += 1
                continue
            if ref is None and got is not None and _error_in_dead_node(original_run, ref_err):
                outcome.note += f" at {plan} onnxruntime fails in a node whose result nobody reads"
                outcome.runs_compared += 1
                continue
        if ref is None and got is not None:
            shapes = [list(g.shape) for g in got]
            outcome.findings.append(f"{what}at {plan} evonnx returns {shapes} where onnxruntime errors "
                                    f"({ref_err.splitlines()[0][:160] if ref_err else ''})")
        elif ref is not None and got is None:
            outcome.findings.append(f"{what}at {plan} evonnx errors where onnxruntime returns a result: "
                                    f"{(got_err or '').splitlines()[0][:240]}")
        elif ref is None:
            outcome.runs_both_failed += 1
        else:
            assert got is not None
            outcome.runs_compared += 1
            if len(ref) != len(got):
                outcome.findings.append(f"{what}at {plan} evonnx gives {len(got)} outputs, onnxruntime {len(ref)}")
                continue
            for i, (r, g) in enumerate(zip(ref, got)):
                diff = compare(r, g, exact[i])
                if diff:
                    outcome.findings.append(f"{what}at {plan} output {i} {diff}")


def check_case(case: Case, work: Path, marker: Path, env_extra: Mapping[str, str] | None = None) -> Outcome:
    """Optimize `case` and compare it with onnxruntime, everything in child processes under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    outcome = Outcome()
    env = child_env(env_extra)
    src = work / "original.onnx"
    onnx.save(case.model, str(src))
    out_dir = work / "out"
    out_dir.mkdir(exist_ok=True)
    dst = out_dir / case.file_name
    dump = work / "dump"
    res = optimize_case(src, dst, dump, work, env, outcome)
    check_marker(marker, "while optimizing (evonnx's own check loads the library)", outcome)
    if res is None or res["status"] != "ok":
        return outcome
    source = dump / "kernels.c"
    if source.is_file():
        outcome.findings += check_source(source.read_text(errors="replace"))
    else:
        outcome.findings.append("optimize --dump-dir wrote no kernels.c")
    reference = first_nan_reference(case.model)
    x0ref = work / "x0ref.onnx" if reference is not None else None
    if reference is not None:
        onnx.save(reference, str(x0ref))
    runs, rc, err, started = run_models(case_feeds(case), src, dst, library_path(dst), work, env, x0ref=x0ref)
    check_marker(marker, "when a fresh process loaded the optimized model's library and ran it", outcome)
    before = (list(outcome.findings), outcome.note)
    judge_runs(exactness(case.model, case.exact), runs, rc, err, started, outcome)
    if outcome.findings != before[0] and not outcome.crashes:
        extra = _second_look(case, runs, work, env)
        if extra:
            outcome.findings, outcome.note = before
            outcome.runs_compared = outcome.runs_both_failed = 0
            judge_runs(exactness(case.model, case.exact), runs + extra, rc, err, started, outcome)
    return outcome


def save_finding(case: Case, outcome: Outcome, folder: Path, key: str, planner: str = "search") -> Path:
    """Keeps the failing model (or one with a kernel left to onnxruntime by the check) and a summary next to it (the
    planner it was optimized with on the line after the case, see `finding_planner`); returns the model's path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.onnx"
    onnx.save(case.model, str(path))
    (folder / f"{key}.txt").write_text(
        f"{case.describe()}\nexact: {case.exact}; file name {case.file_name!r}; seed {case.seed}\n"
        f"planner: {planner}\n" + "\n".join(outcome.findings or outcome.blamed) + "\n")
    return path


def finding_planner(path: Path) -> str:
    """The planner a kept finding was optimized with (`save_finding`; findings kept before it was recorded: the
    default one)."""
    m = re.search(r"^planner: (\w+)$", path.with_suffix(".txt").read_text(), re.M)
    return m.group(1) if m else "search"
