"""The worker process (issue 8): onnxruntime crashing on a model is one error, never the death of the caller.

`evonnx.isolate` runs every onnxruntime session on a user's or an optimized model in a worker process. These
tests crash that worker on purpose (a signal, the way a trapping Div or an out-of-bounds kernel would) and check
the caller gets a CrashError naming the signal and the step, that the next call starts a fresh worker, that
exceptions and results cross unchanged, that Ctrl-C in the caller stops a busy worker, and that a crash leaves no
temporary file.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from evonnx import isolate
from evonnx.isolate import CrashError, doing, isolated


@isolated
def echo(x: object) -> tuple[object, int]:
    return x, os.getpid()


@isolated
def die(signum: int, step: str) -> None:
    doing(step)
    os.kill(os.getpid(), signum)


@isolated
def fail() -> None:
    raise ValueError("bad value in the worker")


@isolated
def temp_then_die() -> str:
    fd, name = tempfile.mkstemp(prefix="left-")
    os.close(fd)
    doing("writing a temporary file")
    os.kill(os.getpid(), signal.SIGSEGV)
    return name


@isolated
def sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_calls_run_in_one_other_process_and_results_cross_unchanged() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    (got, pid1), (_, pid2) = echo(a), echo(None)
    np.testing.assert_array_equal(got, a)
    assert pid1 == pid2 != os.getpid()  # one kept worker, not the caller


@pytest.mark.parametrize("signum", [signal.SIGFPE, signal.SIGSEGV, signal.SIGABRT])
def test_a_crash_names_the_signal_and_the_step_and_the_next_call_works(signum: signal.Signals) -> None:
    _, before = echo(0)
    with pytest.raises(CrashError) as e:
        die(signum, "running the original model (sizes N=3)")
    assert str(e.value) == f"onnxruntime crashed ({signum.name}) while running the original model (sizes N=3)"
    assert e.value.signal == signum.name
    _, after = echo(0)
    assert after not in (before, os.getpid())


def test_an_exception_in_the_worker_arrives_as_itself_with_the_workers_traceback() -> None:
    with pytest.raises(ValueError, match="bad value in the worker") as e:
        fail()
    assert any("in evonnx's worker process" in n and "def fail" not in n and "raise ValueError" in n
               for n in getattr(e.value, "__notes__", []))
    assert echo(1)[0] == 1  # the worker survives an exception


def test_a_crash_leaves_no_temporary_file() -> None:
    echo(0)
    tmp = isolate.worker_tmp()
    assert tmp is not None and tmp.is_relative_to(Path(tempfile.gettempdir()))
    with pytest.raises(CrashError, match=r"SIGSEGV\) while writing a temporary file"):
        temp_then_die()
    assert not tmp.exists()


def test_ctrl_c_in_the_caller_stops_a_busy_worker() -> None:
    # The caller's SIGINT state as a fresh CLI process has it: Python's handler, the signal unblocked in the main
    # thread, and delivered there (a process-wide kill may land on another thread of a long pytest process, and
    # the main thread, waiting on the worker's pipe, would not see it for the whole sleep).
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        _, pid = echo(0)
        timer = threading.Timer(0.5, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            sleep(30)
        assert time.monotonic() - t0 < 10
    finally:
        signal.signal(signal.SIGINT, handler)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, not left sleeping
    assert echo(2)[0] == 2


def test_evonnx_isolate_0_runs_in_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVONNX_ISOLATE", "0")
    assert echo(0)[1] == os.getpid()


@isolated
def leave(status: int) -> None:
    import sys

    print("the worker's own complaint", file=sys.stderr, flush=True)
    os._exit(status)


def test_a_worker_that_exits_says_so_with_its_last_stderr_line_not_as_a_crash() -> None:
    with pytest.raises(CrashError) as e:
        leave(3)
    assert str(e.value) == ("evonnx's worker process ended (exit status 3) while running leave: "
                            "the worker's own complaint")
    assert echo(4)[0] == 4


def test_a_killed_callers_worker_removes_its_own_folder(tmp_path: Path) -> None:
    """A caller killed outright (SIGKILL, or SIGTERM to a process using the API, which runs no atexit) cannot remove
    its worker's folder: the worker, reading EOF, removes it as it exits (29 such folders had piled up in /tmp)."""
    import subprocess
    import sys

    script = ("from evonnx import isolate\nfrom test_isolate import echo\necho(0)\n"
              "print(isolate.worker_tmp(), flush=True)\nimport time\ntime.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *os.environ.get(
        "PYTHONPATH", "").split(os.pathsep)]).rstrip(os.pathsep))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        folder = Path(proc.stdout.readline().strip())
        assert folder.name.startswith("evonnx-worker-") and folder.is_dir()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not folder.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
