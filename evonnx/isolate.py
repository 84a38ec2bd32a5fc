"""onnxruntime runs on models that evonnx did not write in a worker process.

onnxruntime can kill its process on a model that is hostile or just unlucky. An int64 Div of INT64_MIN by -1
traps (SIGFPE), both when it folds constants at session start and when a kernel runs. A fused kernel with a bug
can segfault. In the process of `evonnx optimize`, such a crash would end the run with no message and leave the
staged outputs behind.

So every function that runs onnxruntime on a user's model or on an optimized model is `@isolated`. Each evonnx
process has one worker process, started on first use and kept for later calls. The worker runs the function and
sends back its result or its exception. Before each risky step, the function calls `doing("...")` to say what it
is doing.

If the worker dies, the call raises `CrashError`. It names the signal and the last thing the worker said it was
doing. The next call starts a new worker. The worker's temporary files go in a folder that the parent owns and
removes, so a crash leaves nothing behind.

The worker is a plain `python -c` child, not a multiprocessing spawn, so a user's script is never imported
again in the child. EVONNX_ISOLATE=0 runs everything in the calling process (for debugging with pdb).
"""

from __future__ import annotations

import atexit
import functools
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, ParamSpec, TypeVar

from evonnx.errors import EvonnxError, InternalError

P = ParamSpec("P")
R = TypeVar("R")

# Set in the worker: an @isolated function called there runs directly, and `doing` reports to the parent.
_IN_WORKER = False
_TO_PARENT: IO[bytes] | None = None


class CrashError(EvonnxError):
    """The worker process died: onnxruntime (or a kernel it ran) crashed. `signal` is the signal's name (or the
    exit status), `doing` the step the worker last announced."""

    def __init__(self, signal_name: str, doing: str, last_words: str = ""):
        if signal_name.startswith("exit status"):  # not a crash: the worker itself failed (its last stderr line)
            super().__init__(f"evonnx's worker process ended ({signal_name}) while {doing}"
                             + (f": {last_words}" if last_words else ""))
        else:
            super().__init__(f"onnxruntime crashed ({signal_name}) while {doing}")
        self.signal = signal_name
        self.doing = doing

        self.last_words = last_words

    def __reduce__(self) -> tuple[Any, ...]:
        return (CrashError, (self.signal, self.doing, self.last_words))


def doing(what: str) -> None:
    """Say, from inside an @isolated function, what the worker does next. A crash names the last one."""
    if _TO_PARENT is not None:
        _send(_TO_PARENT, ("doing", what))


def isolated(fn: Callable[P, R]) -> Callable[P, R]:
    """Make a module-level function run in the worker process. Its arguments and its result or exception must
    pickle."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if _IN_WORKER or os.environ.get("EVONNX_ISOLATE", "1") == "0":
            return fn(*args, **kwargs)
        result: R = _WORKER.call(fn.__module__, fn.__qualname__, args, kwargs)
        return result

    return wrapper


def _send(stream: IO[bytes], message: object) -> None:
    pickle.dump(message, stream, protocol=pickle.HIGHEST_PROTOCOL)
    stream.flush()


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


class _Worker:
    """The one worker of this process, started on demand; calls are serialised."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = 0  # the process that started `_proc` (a fork must not share it)
        self._tmp: str | None = None
        atexit.register(self.stop)

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._pid == os.getpid() and self._proc.poll() is None:
            return self._proc
        self.stop()
        self._tmp = tempfile.mkdtemp(prefix="evonnx-worker-")
        env = dict(os.environ)
        # the same evonnx and the same libraries as this process, whatever put them on sys.path
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["TMPDIR"] = self._tmp
        env.setdefault("ORT_DISABLE_TELEMETRY", "1")
        # its stderr (Python's own messages, should it fail to start) goes to a file in that folder
        with open(Path(self._tmp) / "stderr", "wb") as err:
            self._proc = subprocess.Popen([sys.executable, "-c", "from evonnx.isolate import _serve; _serve()"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                                          close_fds=True)
        self._pid = os.getpid()
        return self._proc

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and self._pid == os.getpid():
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _last_words(self) -> str:
        try:
            lines = (Path(self._tmp) / "stderr").read_text(errors="replace").strip().splitlines() if self._tmp else []
        except OSError:
            return ""
        return lines[-1][:200] if lines else ""

    def _kill(self) -> None:
        if self._proc is not None and self._pid == os.getpid() and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self.stop()

    def call(self, module: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            last = f"running {name}"
            try:
                try:
                    _send(proc.stdin, (module, name, args, kwargs))
                except BrokenPipeError:
                    pass  # it died starting: the read below says how
                while True:
                    try:
                        kind, value = pickle.load(proc.stdout)
                    except (EOFError, pickle.UnpicklingError, OSError):
                        code = proc.wait()
                        words = self._last_words()
                        self.stop()
                        raise CrashError(_signal_name(code), last, words) from None
                    if kind == "doing":
                        last = value
                    elif kind == "ok":
                        return value
                    elif kind == "error":
                        raise value
                    else:
                        raise InternalError(f"the worker sent an unknown message {kind!r}")
            except BaseException as e:
                if not isinstance(e, Exception):
                    self._kill()  # Ctrl-C: the worker may be mid-call
                raise


_WORKER = _Worker()


def _serve() -> None:
    """The worker's loop: read a call, run it, send `("ok", result)` or `("error", exception)`; exit at EOF."""
    global _IN_WORKER, _TO_PARENT
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the worker
    _IN_WORKER = True
    # the protocol owns the original stdout; anything printed (a library's stray print) goes to stderr
    to_parent = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _TO_PARENT = to_parent
    from_parent = os.fdopen(os.dup(0), "rb")
    while True:
        try:
            module, name, args, kwargs = pickle.load(from_parent)
        except EOFError:  # the parent is done, or gone (killed: SIGKILL, or SIGTERM outside the CLI)
            _leave()
            return
        try:
            fn: Any = importlib.import_module(module)
            for part in name.split("."):
                fn = getattr(fn, part)
            reply: tuple[str, object] = ("ok", fn(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - every exception goes back to the caller
            e.add_note(f"in evonnx's worker process:\n{traceback.format_exc()}")
            reply = ("error", e)
            try:
                pickle.dumps(e)
            except Exception:  # noqa: BLE001 - an exception that does not pickle becomes an InternalError
                reply = ("error", InternalError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        try:
            _send(to_parent, reply)
        except BrokenPipeError:  # the parent died during the call
            _leave()
            return
        except Exception as e:  # noqa: BLE001 - a result that does not pickle is a bug
            _send(to_parent, ("error", InternalError(f"cannot send the result of {name}: {e}")))


def _leave() -> None:
    """The worker's temporary folder (its TMPDIR), removed by the worker itself as it exits: the parent removes it
    too when it stops the worker, but a parent killed outright (SIGKILL; SIGTERM to a process using the API, which
    runs no atexit) left it behind, one `evonnx-worker-*` folder per killed process."""
    own = os.environ.get("TMPDIR", "")
    if Path(own).name.startswith("evonnx-worker-"):
        shutil.rmtree(own, ignore_errors=True)


def register_library(options: Any, library: str | Path) -> None:
    """Register the kernel library `library` with onnxruntime SessionOptions `options`, loaded afresh: through a hard
    link (a copy across file systems) in a new temporary folder, removed once loaded. dlopen returns a library
    already loaded from the same path without looking at the file, and the file changes between calls: each guard
    stage, and the check's rebuild with the baseline CPU kernels alone, writes a new library at the same path, which
    would otherwise run the old code for as long as anything still holds it (a traceback does). The path is absolute
    either way: dlopen searches its library path, not the current folder, for a name without a slash."""
    path = Path(library).absolute()
    with tempfile.TemporaryDirectory(prefix="evonnx-load-") as tmp:
        fresh = Path(tmp) / path.name
        try:
            os.link(path, fresh)
        except OSError:
            shutil.copyfile(path, fresh)
        options.register_custom_ops_library(str(fresh))


def load_failure(optimized: str | Path, library: str | Path, original: bytes) -> str:
    """Why onnxruntime cannot load the model file `optimized` with its kernel library `library` while it loads the
    model `original` (serialized): the first line of its error, or "" where it loads both, or neither (an original
    that needs another library of custom ops, which the user registers). In the worker; a crash is a reason too."""
    try:
        return _load_failure(str(Path(optimized).absolute()), str(Path(library).absolute()), original)
    except CrashError as e:
        return str(e)


@isolated
def _load_failure(optimized: str, library: str, original: bytes) -> str:
    import onnxruntime as ort

    def error(model: str | bytes, library: str | None) -> str:
        so = ort.SessionOptions()
        so.log_severity_level = 4
        try:
            if library is not None:
                register_library(so, library)
            doing("loading the optimized model" if library is not None else "loading the original model")
            ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types; report any of them
            return (str(e).strip().splitlines() or [type(e).__name__])[0]
        return ""

    failure = error(optimized, library)
    return failure if failure and not error(original, None) else ""


def worker_tmp() -> Path | None:
    """The worker's temporary folder, while a worker runs (tests)."""
    return Path(_WORKER._tmp) if _WORKER._tmp is not None else None
