"""Kernel libraries built with AddressSanitizer and UndefinedBehaviorSanitizer, and the environment to run them.

evonnx's build passes extra cflags to the kernels' compile step only (its link has `-Wl,-z,defs` and no
`-fsanitize`), so the sanitized library is compiled and linked here from the pieces the build exposes: the
generated `kernels.c` (from `optimize(..., dump_dir=...)`), the compile flags (`evonnx.toolchain.kernel_cflags`),
and the runtime's source and onnxruntime's C API headers (`build.ort_headers_dir()`); the runtime is compiled
with the sanitizers too. A Python child loads it with the sanitizer runtimes preloaded (`sanitizer_env`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from evonnx.kernels import build
from evonnx.toolchain import kernel_cflags

SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g")
RUNTIME_DIR = Path(build.__file__).resolve().parent / "runtime"
RUNTIME_SOURCE = RUNTIME_DIR / "evonnx_ort.cc"
RUNTIME_FLAGS = ("-std=c++17", "-O1", "-fPIC", "-fvisibility=hidden")


def _cc() -> str:
    return os.environ.get("CC", "gcc")


def _cxx() -> str:
    return os.environ.get("CXX", "g++")


def runtime_library(name: str) -> Path | None:
    """The compiler's sanitizer runtime `name` (libasan.so, libubsan.so), or None when it has none."""
    if shutil.which(_cc()) is None:
        return None
    out = subprocess.run([_cc(), f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    p = Path(out)
    return p.resolve() if p.is_absolute() and p.exists() else None


def sanitizer_runtime_missing() -> str | None:
    """Why sanitized kernels cannot be built and run here, or None."""
    if shutil.which(_cc()) is None or shutil.which(_cxx()) is None:
        return f"no C/C++ compiler ({_cc()}, {_cxx()})"
    for lib in ("libasan.so", "libubsan.so"):
        if runtime_library(lib) is None:
            return f"the sanitizer runtime is missing: {_cc()} -print-file-name={lib} names no file"
    with tempfile.TemporaryDirectory(prefix="evonnx-san-probe-") as d:
        src = Path(d) / "probe.c"
        src.write_text("#include <stdlib.h>\nint main(void){ int *p = malloc(4); p[0] = 1; int r = p[0] - 1;"
                       " free(p); return r; }\n")
        exe = Path(d) / "probe"
        r = subprocess.run([_cc(), *SANITIZE, str(src), "-o", str(exe)], capture_output=True, text=True)
        if r.returncode != 0:
            return (f"the sanitizer runtime is missing: {_cc()} {' '.join(SANITIZE)} fails: "
                    f"{r.stderr.strip()[:200]}")
        r = subprocess.run([str(exe)], capture_output=True, text=True,
                           env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0"})
        if r.returncode != 0:
            return f"the sanitizer runtime is missing or unusable here: a sanitized probe exits {r.returncode}"
    return None


def sanitizer_env() -> dict[str, str]:
    """Environment for a Python child that loads a sanitized library (ASan must come first in the process)."""
    asan, ubsan = runtime_library("libasan.so"), runtime_library("libubsan.so")
    assert asan is not None and ubsan is not None
    return {
        "LD_PRELOAD": f"{asan} {ubsan}",
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=0:allocator_may_return_null=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }


def _run(command: list[str]) -> None:
    r = subprocess.run(command, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"$ {' '.join(command)}\n{r.stderr[-3000:]}")


class SanitizedBuilder:
    """Compiles the runtime once per builder, then a sanitized library per kernels.c."""

    def __init__(self, work: Path):
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self._runtime: Path | None = None
        self._lock = threading.Lock()

    def runtime(self) -> Path:
        with self._lock:
            if self._runtime is None:
                obj = self.work / "evonnx_ort.asan.o"
                _run([_cxx(), *RUNTIME_FLAGS, *SANITIZE, f"-I{RUNTIME_DIR}", f"-I{build.ort_headers_dir()}", "-c",
                      str(RUNTIME_SOURCE), "-o", str(obj)])
                self._runtime = obj
            return self._runtime

    def library(self, kernels_c: Path, out: Path) -> Path:
        """`out`: the kernels of `kernels_c` and the runtime, both with the sanitizers."""
        runtime = self.runtime()
        obj = out.with_name(out.name + ".o")
        _run([_cc(), *kernel_cflags(_cc()), *SANITIZE, f"-I{RUNTIME_DIR}", "-c", str(kernels_c), "-o", str(obj)])
        _run([_cxx(), "-shared", "-Wl,-z,defs", *SANITIZE, "-o", str(out), str(runtime), str(obj), "-lm"])
        return out
