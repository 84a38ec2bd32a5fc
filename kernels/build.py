"""Build a model's onnxruntime custom-op library, `out.evonnx.so`, from its generated C kernels.

The library is two objects linked together: the custom-op runtime (`runtime/evonnx_ort.cc`, C++, compiled once
per install and cached) and the model's kernels (plain C, compiled per model). The runtime is compiled against
onnxruntime's C API headers of version 1.21 (API 21), so the library loads on every onnxruntime >= 1.21; the
headers come from a folder the user names or are fetched once by `kernels/fetch_ort_headers.sh`.

The library links no onnxruntime library: it reaches onnxruntime only through the `OrtApiBase` pointer handed
to `RegisterCustomOps`, its one exported symbol. Every file is written under a temporary name and renamed into
place, so concurrent builds never see a half-written object or library.

A CUDA build (`cuda_source`, from `codegen_cuda.generate_cuda`) also compiles the device code into one fatbin (a
CUBIN per architecture plus PTX of the newest, cached by content), with nvcc or, on a machine without the CUDA
toolkit, NVRTC from NVIDIA's wheel (`kernels/nvrtc.py`; `cuda_compiler`), and embeds it as data: a generated C
file defines `evo_cuda_image` in .rodata. The library still links no CUDA library; the runtime dlopens the
driver when a CUDA kernel is created.
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
import signal
import struct
import subprocess
import tempfile
from pathlib import Path

from evonnx.errors import BuildError
from evonnx.kernels import nvrtc
from evonnx.kernels.codegen_c import CSource
from evonnx.paths import cache_dir
from evonnx.toolchain import cpu_runs_v3, kernel_cflags

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

# -ffp-contract=off: NonMaxSuppression's IoU must round each operation as onnxruntime's does (evonnx_nms.h).
_RUNTIME_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off")
# -z defs: a kernels object that lacks evo_kernel_table fails here rather than at dlopen time.
_LINK_FLAGS = ("-shared", "-Wl,-z,defs", "-Wl,--as-needed")


def _linker_flags() -> tuple[str, ...]:
    """gold where binutils has it: it links a model's library in about half the time of ld.bfd (36 against 84 ms
    for one small kernel, which is a fifth of optimizing a small graph)."""
    return ("-fuse-ld=gold",) if shutil.which("ld.gold") else ()
# Belt and braces on top of -fvisibility=hidden: template instantiations from libstdc++ headers carry default
# visibility, and the version script keeps them out of the dynamic symbol table.
_VERSION_SCRIPT = "{ global: RegisterCustomOps; local: *; };\n"
_MAX_ERROR_LINES = 40

# --fmad=false: no fused multiply-add (as -ffp-contract=off for the CPU kernels). nvcc's defaults already give
# IEEE division and sqrt and keep denormals (no fast math).
_NVCC_FLAGS = ("-fatbin", "-std=c++17", "--fmad=false", "--threads", "0")
DEFAULT_CUDA_ARCHS = ("sm_80", "sm_90")
_DEFAULT_CUDA_ROOTS = ("/usr/local/cuda",)
_FATBIN_MAGIC = 0xBA55ED50


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
        *(p.read_bytes() for p in sorted(_RUNTIME_DIR.glob("*.[ch]*"))),  # evonnx_ort.cc and what it includes
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
    kernel_source: str | CSource,
    out_path: Path,
    *,
    model_name: str,
    cflags: tuple[str, ...] = (),
    headers: Path | None = None,
    cuda_source: str | None = None,
    cuda_archs: tuple[str, ...] = DEFAULT_CUDA_ARCHS,
    cuda_compiler: str = "auto",
    cpu_variants: bool | None = None,
) -> Path:
    """Compile `kernel_source` (C11, includes "evonnx_abi.h") and link it with the runtime into `out_path`.

    `cpu_variants` (default: where this machine runs them, `toolchain.cpu_runs_v3`) builds the task functions for
    x86-64-v3 as well as for the baseline (prelude.c, EVO_PICK); False builds the baseline only.

    A `CSource` of more than `PARALLEL_BUILD_CHARS` characters is compiled as several translation units at
    once, one per core (`build_jobs`); a string is one unit. `model_name` is for messages; `headers` is passed
    to `runtime_object`. The result needs only libc, libm, libstdc++ and libgcc at run time. On a compiler error
    raises BuildError with the compiler's first lines and keeps a copy of the failing source in the cache at a
    path the message names. The build folder and the partial library are removed on every path, Ctrl-C included.

    With `cuda_source` (from `codegen_cuda.generate_cuda`; then `kernel_source` must end with
    `codegen_cuda.generate_cuda_host` of the same kernels) the kernels are compiled with `-DEVO_WITH_CUDA` and
    the fatbin for `cuda_archs` is embedded (compiled by `cuda_compiler`: "nvcc", "nvrtc", or "auto", nvcc where
    found); without it nothing CUDA is needed.
    """
    out_path = Path(out_path)
    runtime = runtime_object(headers)
    cc = os.environ.get("CC", "gcc")
    cxx = os.environ.get("CXX", "g++")
    image = (cuda_fatbin(cuda_source, cuda_archs, model_name=model_name, compiler=cuda_compiler)
             if cuda_source is not None else None)
    if isinstance(kernel_source, str):
        units = [kernel_source]
    else:
        jobs = build_jobs() if len(kernel_source) > PARALLEL_BUILD_CHARS else 1
        units = kernel_source.units(jobs)
    with tempfile.TemporaryDirectory(prefix="evonnx-build-") as tmp:
        work = Path(tmp)
        sources = [work / (f"kernels{k}.c" if len(units) > 1 else "kernels.c") for k in range(len(units))]
        for path, text in zip(sources, units):
            path.write_text(text)
        variants = cpu_runs_v3() if cpu_variants is None else cpu_variants
        flags = [*kernel_cflags(cc), *cflags, *(["-DEVO_WITH_CUDA"] if image is not None else []),
                 *([] if variants else ["-DEVO_NO_CLONES"]), f"-I{_RUNTIME_DIR}"]
        _run_compilers(
            [([cc, *flags, "-c", str(src), "-o", str(src.with_suffix(".o"))], src) for src in sources],
            f"compiling the kernels of {model_name!r}",
        )
        objects = [str(src.with_suffix(".o")) for src in sources]
        source = sources[0]
        if image is not None:
            image_source = work / "cuda_image.c"
            image_source.write_text(_image_source(image))
            image_obj = work / "cuda_image.o"
            _run_compiler(
                [cc, "-std=c11", "-fPIC", "-c", str(image_source), "-o", str(image_obj)],
                f"compiling the CUDA image of {model_name!r}",
                source=image_source,
            )
            objects.append(str(image_obj))

        version_script = work / "exports.map"
        version_script.write_text(_VERSION_SCRIPT)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        partial = _partial_name(out_path)
        try:
            _run_compiler(
                [
                    cxx,
                    *_LINK_FLAGS,
                    *_linker_flags(),
                    f"-Wl,--version-script={version_script}",
                    "-o",
                    str(partial),
                    str(runtime),
                    *objects,
                    "-lm",
                ],
                f"linking the library of {model_name!r}",
                source=source,
            )
            os.replace(partial, out_path)
        finally:
            partial.unlink(missing_ok=True)
    return out_path


# ---------------------------------------------------------------------------------------------------------
# CUDA: nvcc -> fatbin -> data in the library
# ---------------------------------------------------------------------------------------------------------
def nvcc_path() -> Path:
    """nvcc: `$EVONNX_NVCC`, else the PATH, else `$CUDA_HOME/bin`, `$CUDA_PATH/bin`, `/usr/local/cuda/bin`."""
    named = os.environ.get("EVONNX_NVCC")
    if named:
        if not os.access(named, os.X_OK):
            raise BuildError(f"EVONNX_NVCC {named!r} is not an executable")
        return Path(named)
    found = shutil.which("nvcc")
    if found:
        return Path(found)
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *_DEFAULT_CUDA_ROOTS):
        if root and os.access(Path(root) / "bin" / "nvcc", os.X_OK):
            return Path(root) / "bin" / "nvcc"
    raise BuildError(
        "--target cuda needs nvcc (the CUDA toolkit, of the CUDA major version onnxruntime-gpu is built for) to "
        "compile the CUDA kernels; none is on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin (or set EVONNX_NVCC)"
    )


def cuda_device_count() -> int:
    """CUDA devices the driver sees (0 without a driver or device); for `--target`'s default (cuda if > 0)."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def cuda_unavailable() -> str | None:
    """Why CUDA kernels cannot run here (no driver, no device, no onnxruntime-gpu, no nvcc), or None."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver: libcuda.so.1 cannot be loaded"
    if cuda_device_count() < 1:
        return "the CUDA driver finds no device"
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider: install onnxruntime-gpu"
    try:
        which_cuda_compiler("auto")
    except BuildError as e:
        return str(e)
    return None


def cuda_include_dir() -> Path | None:
    """The CUDA toolkit's include folder (holding cuda.h) of the nvcc `nvcc_path` finds, or None."""
    try:
        nvcc = nvcc_path()
        result = subprocess.run([str(nvcc), "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                                capture_output=True, text=True)
    except (BuildError, OSError):
        return None
    for m in re.finditer(r'INCLUDES="-I([^"]+)"', result.stdout + result.stderr):
        folder = Path(m.group(1).strip())
        if (folder / "cuda.h").is_file():
            return folder.resolve()
    return None


def _gencode(archs: tuple[str, ...]) -> list[str]:
    """`-gencode` flags: a CUBIN per `sm_XY`, plus PTX of the newest so newer GPUs can JIT it."""
    if not archs:
        raise BuildError("no CUDA architectures given")
    numbers = []
    for a in archs:
        m = re.fullmatch(r"sm_(\d+)", a)
        if m is None:
            raise BuildError(f"CUDA architecture {a!r} is not of the form sm_XY (e.g. sm_80)")
        numbers.append(int(m.group(1)))
    flags = []
    for n in sorted(set(numbers)):
        flags += ["-gencode", f"arch=compute_{n},code=sm_{n}"]
    top = max(numbers)
    return flags + ["-gencode", f"arch=compute_{top},code=compute_{top}"]


def which_cuda_compiler(choice: str) -> str:
    """"nvcc" or "nvrtc" for `choice` ("auto": nvcc where `nvcc_path` finds it, else NVRTC); BuildError when the
    one chosen, or neither, is here."""
    if choice not in ("auto", "nvcc", "nvrtc"):
        raise BuildError(f"unknown CUDA compiler {choice!r} (auto, nvcc or nvrtc)")
    if choice == "nvrtc":
        nvrtc.nvrtc()
        return "nvrtc"
    try:
        nvcc_path()
        return "nvcc"
    except BuildError as e:
        if choice == "nvcc":
            raise
        if nvrtc.available():
            return "nvrtc"
        raise BuildError(f"{e}; or NVRTC: pip install 'evonnx[cuda]'") from None


def _cuda_archs(archs: tuple[str, ...]) -> list[int]:
    _gencode(archs)  # validates them
    return sorted({int(a[3:]) for a in archs})


def cuda_fatbin(cuda_source: str, archs: tuple[str, ...] = DEFAULT_CUDA_ARCHS, *, model_name: str = "",
                compiler: str = "auto") -> bytes:
    """The fatbin of `cuda_source` for `archs` (plus PTX), compiled by nvcc or NVRTC (`which_cuda_compiler`) and
    cached by content.

    Checks that the result holds a CUBIN for every arch and the PTX; raises BuildError otherwise or when the
    compiler fails (nvcc: keeping the source at the path the message names).
    """
    use = which_cuda_compiler(compiler)
    if use == "nvcc":
        nvcc = nvcc_path()
        flags = (*_NVCC_FLAGS, *_gencode(tuple(archs)))
        version = _compiler_version(str(nvcc))
    else:
        numbers = _cuda_archs(tuple(archs))
        flags = (*nvrtc.NVRTC_FLAGS, *(f"sm_{n}" for n in numbers), f"compute_{numbers[-1]}")
        version = nvrtc.version_text()
    key = hashlib.sha256()
    for part in (cuda_source.encode(), version.encode(), "\0".join(flags).encode()):
        key.update(hashlib.sha256(part).digest())
    target = cache_dir() / "cuda" / f"kernels-{key.hexdigest()[:24]}.fatbin"
    if not target.is_file():
        _make_cache_folder(target.parent)
        partial = _partial_name(target)
        try:
            if use == "nvcc":
                with tempfile.TemporaryDirectory(prefix="evonnx-cuda-") as tmp:
                    source = Path(tmp) / "kernels.cu"
                    source.write_text(cuda_source)
                    _run_compiler([str(nvcc), *flags, str(source), "-o", str(partial)],
                                  f"compiling the CUDA kernels of {model_name!r}", source=source)
            else:
                images = [("elf", n, nvrtc.compile_image(cuda_source, f"sm_{n}", model_name=model_name))
                          for n in numbers]
                top = numbers[-1]
                images.append(("ptx", top, nvrtc.compile_image(cuda_source, f"compute_{top}",
                                                                model_name=model_name)))
                partial.write_bytes(nvrtc.make_fatbin(images))
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    image = target.read_bytes()
    want = {("elf", int(a[3:])) for a in archs} | {("ptx", max(int(a[3:]) for a in archs))}
    missing = want - set(fatbin_contents(image))
    if missing:
        raise BuildError(f"the CUDA fatbin of {model_name!r} lacks {sorted(missing)} ({target})")
    return image


def fatbin_contents(image: bytes) -> list[tuple[str, int]]:
    """(kind, sm) of each entry of a fatbin: kind "elf" (a CUBIN) or "ptx", sm e.g. 80."""
    return [(kind, sm) for kind, sm, _ in fatbin_entries(image)]


def fatbin_entries(image: bytes) -> list[tuple[str, int, bytes]]:
    """(kind, sm, payload) of each entry of a fatbin: kind "elf" (a CUBIN) or "ptx", sm e.g. 80.

    The layout (no public spec; cuobjdump is not in every toolkit): a 16-byte header (u32 magic 0xBA55ED50,
    u16 version, u16 header size, u64 size of the entries), then entries, each a header (u16 kind 1 = PTX,
    2 = ELF; u16 version; u32 header size; u64 padded payload size; ... u32 sm at offset 28) and its payload.
    A CUBIN payload, when not compressed, is an ELF for machine EM_CUDA (190); that is checked too.
    """
    if len(image) < 16:
        raise BuildError(f"not a fatbin: {len(image)} bytes")
    magic, _version, header, size = struct.unpack_from("<IHHQ", image, 0)
    if magic != _FATBIN_MAGIC or header + size > len(image):
        raise BuildError("not a fatbin (bad magic or size)")
    out: list[tuple[str, int, bytes]] = []
    off = header
    while off < header + size:
        kind, _ev, eheader, padded = struct.unpack_from("<HHIQ", image, off)
        (sm,) = struct.unpack_from("<I", image, off + 28)
        payload = image[off + eheader: off + eheader + padded]
        if kind == 2:
            if payload[:4] == b"\x7fELF" and struct.unpack_from("<H", payload, 18)[0] != 190:
                raise BuildError("fatbin CUBIN entry is an ELF for another machine than EM_CUDA")
            out.append(("elf", sm, payload))
        elif kind == 1:
            out.append(("ptx", sm, payload))
        else:
            out.append((f"kind{kind}", sm, payload))
        if eheader == 0:
            raise BuildError("malformed fatbin entry")
        off += eheader + padded
    return out


def _image_source(image: bytes) -> str:
    """C defining the fatbin as hidden data in .rodata (a string literal of exactly its size: no NUL)."""
    lines = ['"' + "".join(f"\\x{b:02x}" for b in image[i: i + 64]) + '"' for i in range(0, len(image), 64)]
    return (
        "/* evonnx: the CUDA fatbin of this library (generated by kernels/build.py) */\n"
        "#include <stddef.h>\n"
        f'__attribute__((visibility("hidden"), aligned(64))) const unsigned char evo_cuda_image[{len(image)}] =\n'
        + "\n".join(lines) + ";\n"
        f'__attribute__((visibility("hidden"))) const size_t evo_cuda_image_size = {len(image)};\n'
    )


def _make_cache_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(
            f"cannot create the cache folder {folder} ({e.strerror}); set EVONNX_CACHE_DIR"
        ) from e


def _partial_name(target: Path) -> Path:
    """A unique sibling of `target` for the compiler to write, renamed onto `target` when complete. Not created
    here, so the compiler creates it with the usual permissions (mkstemp would make it 0600)."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")


# A model's kernels are compiled as one translation unit per core above this size (the prelude, about 10 k
# characters, is compiled again in each): gcc takes about 25 s per megabyte of generated kernels at -O3.
PARALLEL_BUILD_CHARS = 64_000


def build_jobs() -> int:
    """Compilers run at once: `$EVONNX_BUILD_JOBS`, else the cores this process may run on."""
    named = os.environ.get("EVONNX_BUILD_JOBS", "")
    if named.strip().isdigit() and int(named) > 0:
        return int(named)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _run_compilers(commands: list[tuple[list[str], Path]], what: str) -> None:
    """`_run_compiler` for each (command, source) at once; the first failure (in the given order) is raised once
    all have ended. One command runs as `_run_compiler` does."""
    if len(commands) == 1:
        _run_compiler(commands[0][0], what, source=commands[0][1])
        return
    procs: list[subprocess.Popen[str]] = []
    try:
        for command, _ in commands:
            procs.append(_start_compiler(command, what))
        results = [(p, *p.communicate()) for p in procs]
    except BaseException:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        raise
    for (command, src), (proc, out, err) in zip(commands, results):
        _compiler_result(command, what, src, proc.returncode, out, err)


def _start_compiler(command: list[str], what: str) -> subprocess.Popen[str]:
    try:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError as e:
        raise BuildError(
            f"{what}: compiler {command[0]!r} not found (set CC/CXX or install gcc and g++)"
        ) from e


def _run_compiler(command: list[str], what: str, *, source: Path) -> None:
    """Run a compiler. On failure, raise BuildError whose first line names the step, a copy of the source kept
    in the cache (`_keep_failed_source`; the build folder itself is always removed) and the compiler's first
    error; the command and the compiler's output follow on the next lines. A compiler stopped by SIGINT (Ctrl-C
    reaches the whole foreground process group) raises KeyboardInterrupt."""
    proc = _start_compiler(command, what)
    try:
        out, err = proc.communicate()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    _compiler_result(command, what, source, proc.returncode, out, err)


def _compiler_result(command: list[str], what: str, source: Path, returncode: int, stdout: str,
                     stderr: str) -> None:
    """Raise for a compiler that failed (see `_run_compiler`)."""
    if returncode == -signal.SIGINT:
        raise KeyboardInterrupt
    if returncode != 0:
        output = stderr or stdout
        first = next((ln.strip() for ln in output.splitlines() if "error" in ln), None) or (
            output.strip().splitlines() or [f"exit status {returncode}"])[0]
        raise BuildError(
            f"{what} failed (source: {_keep_failed_source(source)}): {first}\n$ {' '.join(command)}\n"
            f"{_first_lines(output)}"
        )


def _keep_failed_source(source: Path) -> Path:
    """A copy of a source that failed to build, in `<cache>/failed/`, named by its content (so a failure that
    repeats keeps one file), for the error message and a bug report; the temporary build folder goes away."""
    text = source.read_bytes()
    kept = cache_dir() / "failed" / f"{source.stem}-{hashlib.sha256(text).hexdigest()[:16]}{source.suffix}"
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = _partial_name(kept)
        try:
            partial.write_bytes(text)
            os.replace(partial, kept)
        finally:
            partial.unlink(missing_ok=True)
    except OSError as e:
        log.info("cannot keep the failing source in %s: %s", kept.parent, e)
        return Path(f"not kept: {e.strerror}")
    return kept


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
