"""The child process of the security tests: whatever it runs may crash, hang or execute injected code.

    python sec_child.py optimize SRC DST DUMP_DIR RESULT_JSON [SHAPES_JSON]
        evonnx.api.optimize(SRC, DST, dump_dir=DUMP_DIR[, shapes=...]) with its own check, the planner
        $EVONNX_SEC_PLANNER (default search); writes RESULT_JSON:
        {"status": "ok", "fused": n, "blamed": [reason]} (blamed: why the check left kernels to onnxruntime)
        | {"status": "refused", "type", "message", "kinds"} (an EvonnxError; kinds: its class and its bases' names)
        | {"status": "exception", "type", "message", "traceback"} (any other exception: a finding).

    python sec_child.py run SPEC_JSON
        SPEC: {"runs": [{"label", "model", "library" | null, "feeds", "out", "threads"[, "optimize": bool]
        [, "reuse": bool]}], "progress": path, "arena": bool}. Runs each model on its feeds (an .npz) with
        onnxruntime (graph optimizations off where "optimize" is false, buffer re-use off where "reuse" is), the
        library registered when given, and writes `out`.npz (outputs in order) or `out`.err (the error). Before
        each run it appends the run's label to the progress file, so a crash names the run that died.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import traceback
from pathlib import Path


def optimize(src: str, dst: str, dump: str, result: str, shapes: str = "") -> int:
    import onnx

    from evonnx import api
    from evonnx.blame import blamed_kernel
    from evonnx.errors import EvonnxError

    out: dict[str, object]
    try:
        done = api.optimize(src, dst, dump_dir=dump, planner=os.environ.get("EVONNX_SEC_PLANNER", "search"),
                            **({"shapes": json.loads(shapes)} if shapes else {}))
    except EvonnxError as e:
        # the class and its bases: the oracle judges a VerificationError by its kind, whichever subclass it is
        out = {"status": "refused", "type": type(e).__name__, "message": str(e),
               "kinds": [c.__name__ for c in type(e).__mro__]}
    except BaseException as e:  # noqa: BLE001 - any other exception escaping optimize is what we look for
        out = {"status": "exception", "type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}
    else:
        model = onnx.load(dst)
        fused = sum(1 for n in model.graph.node if n.domain == "ai.evonnx" and n.op_type == "Fused")
        # the kernels the check found a difference starting in, which optimize left to onnxruntime
        blamed = sorted({r.reason for r in done.plan.rejected if blamed_kernel(r.reason) is not None})
        out = {"status": "ok", "fused": fused, "blamed": blamed}
    Path(result).write_text(json.dumps(out))
    return 0


def run(spec_path: str) -> int:
    import numpy as np
    import onnxruntime as ort

    spec = json.loads(Path(spec_path).read_text())
    progress = open(spec["progress"], "a", buffering=1)  # noqa: SIM115 - kept open for the life of the child
    sessions: dict[tuple[str, str | None, int, bool, bool], object] = {}
    for run in spec["runs"]:
        progress.write(run["label"] + "\n")
        progress.flush()
        key = (run["model"], run["library"], run["threads"], run.get("optimize", True), run.get("reuse", True))
        try:
            if key not in sessions:
                so = ort.SessionOptions()
                so.log_severity_level = 4
                so.intra_op_num_threads = run["threads"]
                so.inter_op_num_threads = 1
                so.enable_cpu_mem_arena = bool(spec.get("arena", True))
                so.enable_mem_reuse = bool(run.get("reuse", True))
                if not run.get("optimize", True):
                    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                if run["library"] is not None:
                    so.register_custom_ops_library(run["library"])
                sessions[key] = ort.InferenceSession(run["model"], so, providers=["CPUExecutionProvider"])
            sess = sessions[key]
            with np.load(run["feeds"]) as z:
                feeds = {name: _fresh(z[name], spec.get("malloc_inputs", False)) for name in z.files}
            names = json.loads(Path(run["feeds"] + ".names").read_text())
            feeds = {names[k]: v for k, v in feeds.items()}
            outs = sess.run(None, feeds)  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types; the error is the result
            Path(run["out"] + ".err").write_bytes(f"{type(e).__name__}: {e}".encode("utf-8", "backslashreplace"))
            continue
        np.savez(run["out"] + ".npz", *[np.asarray(o) for o in outs])
    progress.write("done\n")
    return 0


_LIBC = None
_KEEP: list[object] = []


def _fresh(arr, malloc: bool):  # noqa: ANN001, ANN202
    """A copy of `arr`; with `malloc`, in a buffer of exactly its size from libc's malloc (under ASan, a buffer
    with red zones, so that a kernel reading past an input is caught)."""
    import ctypes

    import numpy as np

    if not malloc:
        return np.array(arr, order="C", copy=True)
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None)
        _LIBC.malloc.restype = ctypes.c_void_p
        _LIBC.malloc.argtypes = [ctypes.c_size_t]
    ptr = _LIBC.malloc(max(arr.nbytes, 1))
    _KEEP.append(ptr)
    buf = (ctypes.c_char * arr.nbytes).from_address(ptr) if arr.nbytes else None
    if buf is None:
        return np.empty(arr.shape, arr.dtype)
    out = np.frombuffer(buf, dtype=arr.dtype).reshape(arr.shape)
    out[...] = arr
    return out


def _own_tmp() -> None:
    """Temporary files under the job's folder (`tmp` in the working directory), which the oracle removes with the
    case: a job killed at its timeout (SIGKILL) cannot remove its evonnx-build-* folder itself."""
    tmp = os.path.join(os.getcwd(), "tmp")
    os.makedirs(tmp, exist_ok=True)
    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = None  # computed again from TMPDIR


def _limit_memory() -> None:
    limit = os.environ.get("EVONNX_SEC_MEMORY_LIMIT")
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))


def serve() -> int:
    """A fork server: imports evonnx, onnx and onnxruntime once (most of a child's start-up second), then runs
    each job read from stdin, `{"argv": [mode, ...], "cwd", "stderr", "timeout"}`, in a forked child with its
    stdout and stderr in the file `stderr`, and answers `{"rc": exit code, or null when it timed out}` on stdout.
    A job that crashes, hangs or runs injected code does so in its own process, as with a fresh child."""
    import signal
    import time

    import numpy  # noqa: F401
    import onnx  # noqa: F401
    import onnx_graphsurgeon  # noqa: F401
    import onnxruntime  # noqa: F401

    from evonnx import api  # noqa: F401
    from evonnx.passes import pipeline  # noqa: F401

    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the job's process
            rc = 1
            try:
                fd = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.chdir(job["cwd"])
                _own_tmp()
                _limit_memory()
                mode, *args = job["argv"]
                rc = optimize(*args) if mode == "optimize" else run(*args)
            except BaseException:  # noqa: BLE001 - reported like a fresh child's traceback
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        # time the job ran, not wall time: a step of more than 0.1 s between two looks is the fuzz paused
        # (SIGSTOP to its process group, this server included), not the job, and a job killed for it on resume
        # was a false timeout (and left its build folder behind)
        ran, last = 0.0, time.monotonic()
        status: int | None = None
        while True:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
            now = time.monotonic()
            ran, last = ran + min(now - last, 0.1), now
            if ran > float(job["timeout"]):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.002)
        rc_out = None if status is None else os.waitstatus_to_exitcode(status)
        sys.stdout.write(json.dumps({"rc": rc_out}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "serve":
        sys.exit(serve())
    _own_tmp()
    _limit_memory()
    sys.exit(optimize(*args) if mode == "optimize" else run(*args))
