"""Build a model's onnxruntime custom-op library, `out.evonnx.so`, from its generated C kernels.

The library is two objects linked together: the custom-op runtime (`runtime/evonnx_ort.cc`, C++, compiled once
per install and cached) and the model's kernels (plain C, compiled per model). The runtime is compiled against
onnxruntime's C API headers of version 1.21 (API 21), so the library loads on every onnxruntime >= 1.21; the
headers come from a folder the user names or are fetched once by `kernels/fetch_ort_headers.sh`.

The library links no onnxruntime library: it reaches onnxruntime only through the `OrtApiBase` pointer handed
to `RegisterCustomOps`, its one exported symbol. Every file is written under a temporary name and renamed into
place, so concurrent builds never see a half-written object or library.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from evonnx.errors import BuildError

log = logging.getLogger(__name__)

_KERNELS_DIR = Path(__file__).resolve().parent
_RUNTIME_DIR = _KERNELS_DIR / "runtime"
_RUNTIME_SOURCE = _RUNTIME_DIR / "evonnx_ort.cc"
_ABI_HEADER = _RUNTIME_DIR / "evonnx_abi.h"
_FETCH_SCRIPT = _KERNELS_DIR / "fetch_ort_headers.sh"

_C_API_HEADER = "onnxruntime_c_api.h"
_HEADER_STAMP = ".ort-headers"
# The runtime is tested against API 21; older headers lack calls it uses. Newer headers build too, but then
# the library asks for that newer API and refuses to load on older onnxruntime releases.
_MIN_ORT_API_VERSION = 21

_RUNTIME_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden")
# -ffp-contract=off: no fused multiply-add, so float results match onnxruntime's separate Mul and Add.
# -fno-math-errno: sqrt and friends never set errno; values are unchanged, and gcc may inline them.
_KERNEL_FLAGS = ("-std=c11", "-O3", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off", "-fno-math-errno")
# -z defs: a kernels object that lacks evo_kernel_table fails here rather than at dlopen time.
_LINK_FLAGS = ("-shared", "-Wl,-z,defs", "-Wl,--as-needed")
# Belt and braces on top of -fvisibility=hidden: template instantiations from libstdc++ headers carry default
# visibility, and the version script keeps them out of the dynamic symbol table.
_VERSION_SCRIPT = "{ global: RegisterCustomOps; local: *; };\n"
_MAX_ERROR_LINES = 40


def cache_dir() -> Path:
    """The per-user cache: `$EVONNX_CACHE_DIR`, else `$XDG_CACHE_HOME/evonnx`, else `~/.cache/evonnx`."""
    explicit = os.environ.get("EVONNX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "evonnx"


def ort_headers_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding onnxruntime's C API headers (API 21).

    Looks at `explicit`, then `$EVONNX_ORT_HEADERS`, then `<cache_dir>/ort-headers`, which it fills once with
    `kernels/fetch_ort_headers.sh` (Debian's libonnxruntime-dev 1.21, about 3 s and 10 MB of apt indexes).
    Raises BuildError when the headers cannot be had.
    """
    named = explicit if explicit is not None else os.environ.get("EVONNX_ORT_HEADERS")
    if named:
        folder = Path(named)
        source = "the named folder" if explicit is not None else "EVONNX_ORT_HEADERS"
        if not (folder / _C_API_HEADER).is_file():
            raise BuildError(f"{source} {str(folder)!r} has no {_C_API_HEADER}")
        _check_api_version(folder)
        return folder

    folder = cache_dir() / "ort-headers"
    if not (folder / _HEADER_STAMP).is_file():
        _fetch_headers(folder)
    _check_api_version(folder)
    return folder


def _fetch_headers(folder: Path) -> None:
    if not _FETCH_SCRIPT.is_file():
        raise BuildError(
            f"cannot fetch onnxruntime headers: {_FETCH_SCRIPT} is missing; "
            f"set EVONNX_ORT_HEADERS to a folder holding {_C_API_HEADER}"
        )
    _make_cache_folder(folder.parent)
    log.info("fetching onnxruntime C API headers into %s", folder)
    # One fetch at a time per folder; the script itself returns at once when the stamp already exists.
    with open(folder.parent / "ort-headers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run(["sh", str(_FETCH_SCRIPT), str(folder)], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(
            f"cannot fetch onnxruntime headers into {folder} "
            f"(or set EVONNX_ORT_HEADERS to a folder holding {_C_API_HEADER}):\n"
            f"{_first_lines(result.stderr or result.stdout)}"
        )


def _check_api_version(folder: Path) -> None:
    text = (folder / _C_API_HEADER).read_text(errors="replace")
    match = re.search(r"^#define ORT_API_VERSION (\d+)", text, re.MULTILINE)
    if match is None:
        raise BuildError(f"{folder / _C_API_HEADER} does not define ORT_API_VERSION")
    version = int(match.group(1))
    if version < _MIN_ORT_API_VERSION:
        raise BuildError(
            f"{folder / _C_API_HEADER} is ORT API {version}; evonnx needs >= {_MIN_ORT_API_VERSION} "
            f"(onnxruntime 1.{_MIN_ORT_API_VERSION})"
        )


def runtime_object(headers: Path | None = None) -> Path:
    """The compiled custom-op runtime, built once and cached.

    The cache key covers the runtime source, the ABI header, the onnxruntime C API header, the compiler's
    version and the flags, so any change rebuilds it and an unchanged install never does.
    """
    headers = headers if headers is not None else ort_headers_dir()
    cxx = os.environ.get("CXX", "g++")
    flags = (*_RUNTIME_FLAGS, f"-I{_RUNTIME_DIR}", f"-I{headers}")
    key = hashlib.sha256()
    for part in (
        _RUNTIME_SOURCE.read_bytes(),
        _ABI_HEADER.read_bytes(),
        (headers / _C_API_HEADER).read_bytes(),
        _compiler_version(cxx).encode(),
        "\0".join(_RUNTIME_FLAGS).encode(),
    ):
        key.update(hashlib.sha256(part).digest())
    target = cache_dir() / "runtime" / f"evonnx_ort-{key.hexdigest()[:24]}.o"
    if target.is_file():
        return target

    _make_cache_folder(target.parent)
    log.info("compiling the evonnx onnxruntime runtime into %s", target)
    partial = _partial_name(target)
    try:
        _run_compiler(
            [cxx, *flags, "-c", str(_RUNTIME_SOURCE), "-o", str(partial)],
            f"compiling {_RUNTIME_SOURCE.name}",
            source=_RUNTIME_SOURCE,
        )
        os.replace(partial, target)  # atomic; a concurrent build renames an identical object
    finally:
        partial.unlink(missing_ok=True)
    return target


def build_model_library(
    kernel_source: str,
    out_path: Path,
    *,
    model_name: str,
    cflags: tuple[str, ...] = (),
    headers: Path | None = None,
) -> Path:
    """Compile `kernel_source` (C11, includes "evonnx_abi.h") and link it with the runtime into `out_path`.

    `model_name` is for messages; `headers` is passed to `runtime_object`. The result needs only libc, libm,
    libstdc++ and libgcc at run time. On a compiler error raises BuildError with the compiler's first lines
    and keeps the failing source at a path the message names.
    """
    out_path = Path(out_path)
    runtime = runtime_object(headers)
    cc = os.environ.get("CC", "gcc")
    cxx = os.environ.get("CXX", "g++")
    work = Path(tempfile.mkdtemp(prefix="evonnx-build-"))
    source = work / "kernels.c"
    source.write_text(kernel_source)
    obj = work / "kernels.o"
    _run_compiler(
        [cc, *_KERNEL_FLAGS, *cflags, f"-I{_RUNTIME_DIR}", "-c", str(source), "-o", str(obj)],
        f"compiling the kernels of {model_name!r}",
        source=source,
    )

    version_script = work / "exports.map"
    version_script.write_text(_VERSION_SCRIPT)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = _partial_name(out_path)
    try:
        _run_compiler(
            [
                cxx,
                *_LINK_FLAGS,
                f"-Wl,--version-script={version_script}",
                "-o",
                str(partial),
                str(runtime),
                str(obj),
                "-lm",
            ],
            f"linking the library of {model_name!r}",
            source=source,
        )
        os.replace(partial, out_path)
    finally:
        partial.unlink(missing_ok=True)
    shutil.rmtree(work)
    return out_path


def _make_cache_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(
            f"cannot create the cache folder {folder} ({e.strerror}); set EVONNX_CACHE_DIR"
        ) from e


def _partial_name(target: Path) -> Path:
    """A unique sibling of `target` for the compiler to write, renamed onto `target` when complete.

    Not created here, so the compiler creates it with the usual permissions (mkstemp would make it 0600).
    """
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")


def _run_compiler(command: list[str], what: str, *, source: Path) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise BuildError(
            f"{what}: compiler {command[0]!r} not found (set CC/CXX or install gcc and g++)"
        ) from e
    if result.returncode != 0:
        raise BuildError(
            f"{what} failed (source: {source}):\n$ {' '.join(command)}\n"
            f"{_first_lines(result.stderr or result.stdout)}"
        )


@functools.cache
def _compiler_version(compiler: str) -> str:
    try:
        result = subprocess.run([compiler, "--version"], capture_output=True, text=True)
    except FileNotFoundError as e:
        raise BuildError(f"compiler {compiler!r} not found (set CC/CXX or install gcc and g++)") from e
    if result.returncode != 0:
        raise BuildError(f"{compiler} --version failed:\n{_first_lines(result.stderr)}")
    return result.stdout


def _first_lines(text: str) -> str:
    lines = text.rstrip().splitlines()
    shown = "\n".join(lines[:_MAX_ERROR_LINES])
    return (
        shown
        if len(lines) <= _MAX_ERROR_LINES
        else f"{shown}\n... ({len(lines) - _MAX_ERROR_LINES} more lines)"
    )
