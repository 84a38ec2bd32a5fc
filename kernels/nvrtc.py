"""CUDA kernels compiled with NVRTC, for a machine without the CUDA toolkit (`pip install "evonnx[cuda]"` brings
NVIDIA's `nvidia-cuda-nvrtc` wheel), and the fatbin container both compilers' images go into.

NVRTC compiles the same source nvcc does (the prelude's `__CUDACC_RTC__` branch stands in for <stdint.h> and
<math.h>, which NVRTC does not ship), with the same options: a CUBIN per architecture and the PTX of the newest.
`make_fatbin` packs them as nvcc's `-fatbin` does, uncompressed, so the library embeds one image either way and the
runtime loads it the same way (`cuModuleLoadData`).

The NVRTC library is found at `$EVONNX_NVRTC`, in the `nvidia` wheels (`nvidia/cu13/lib`, `nvidia/cuda_nvrtc/lib`),
then in `$CUDA_HOME`/`$CUDA_PATH`/`/usr/local/cuda` `lib64`. Its major version must be onnxruntime-gpu's CUDA
major (`CUDA_MAJOR`): a CUBIN or PTX from a newer CUDA does not load on an older driver.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import struct
from pathlib import Path

from evonnx.errors import BuildError

CUDA_MAJOR = 13  # onnxruntime-gpu 1.31's CUDA
NVRTC_FLAGS = ("-std=c++17", "--fmad=false")  # as nvcc's (build._NVCC_FLAGS)

_FATBIN_MAGIC = 0xBA55ED50
_KIND = {"ptx": 1, "elf": 2}
_FLAGS_64BIT_LINUX = 0x11  # 64-bit addresses, Linux host: what nvcc writes for x86-64


def _candidates() -> list[Path]:
    out = []
    if os.environ.get("EVONNX_NVRTC"):
        out.append(Path(os.environ["EVONNX_NVRTC"]))
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for sub in (f"cu{CUDA_MAJOR}/lib", "cuda_nvrtc/lib"):
            out.append(Path(root) / sub / f"libnvrtc.so.{CUDA_MAJOR}")
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            out.append(Path(home) / "lib64" / f"libnvrtc.so.{CUDA_MAJOR}")
    return out


@functools.cache
def nvrtc() -> tuple[ctypes.CDLL, tuple[int, int], Path]:
    """The NVRTC library, its version and path; BuildError naming where it was looked for."""
    tried = _candidates()
    path = next((p for p in tried if p.is_file()), None)
    if path is None:
        raise BuildError(f"--cuda-compiler nvrtc needs NVRTC {CUDA_MAJOR} (pip install 'evonnx[cuda]', or set "
                         f"EVONNX_NVRTC); looked in {', '.join(str(p.parent) for p in tried[:4])}")
    try:
        # libnvrtc dlopens its builtins by soname; loaded first from beside it, that finds them
        for builtins in sorted(path.parent.glob(f"libnvrtc-builtins.so.{CUDA_MAJOR}*")):
            if ".alt." not in builtins.name:
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise BuildError(f"cannot load NVRTC {path}: {e}") from None
    major, minor = ctypes.c_int(), ctypes.c_int()
    if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
        raise BuildError(f"NVRTC {path} does not report its version")
    if major.value != CUDA_MAJOR:
        raise BuildError(f"NVRTC {path} is CUDA {major.value}.{minor.value}; onnxruntime-gpu's kernels need CUDA "
                         f"{CUDA_MAJOR}")
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib, (major.value, minor.value), path


def available() -> bool:
    try:
        nvrtc()
    except BuildError:
        return False
    return True


def version_text() -> str:
    _, (major, minor), path = nvrtc()
    return f"nvrtc {major}.{minor} {path.resolve()}"


def compile_image(source: str, arch: str, *, model_name: str = "") -> bytes:
    """`source` compiled for `arch`: `sm_XY` gives a CUBIN, `compute_XY` PTX (NUL-terminated, as NVRTC gives it)."""
    lib, _, _ = nvrtc()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernels.cu", 0, None, None) != 0:
        raise BuildError(f"NVRTC cannot create a program for {model_name!r}")
    try:
        opts = [f"-arch={arch}".encode(), *(f.encode() for f in NVRTC_FLAGS)]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        if rc != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            first = [ln for ln in log.value.decode(errors="replace").splitlines() if "error" in ln][:3]
            raise BuildError(f"NVRTC failed compiling the CUDA kernels of {model_name!r} for {arch} "
                             f"({lib.nvrtcGetErrorString(rc).decode()}): {' | '.join(first)[:600]}")
        cubin = arch.startswith("sm_")
        get_size, get = ((lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if cubin
                         else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX))
        size = ctypes.c_size_t()
        get_size(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        get(prog, buf)
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _ptx_version(ptx: bytes) -> tuple[int, int]:
    m = re.search(rb"^\s*\.version\s+(\d+)\.(\d+)", ptx, re.MULTILINE)
    if m is None:
        raise BuildError("NVRTC's PTX has no .version line")
    return int(m.group(1)), int(m.group(2))


def make_fatbin(images: list[tuple[str, int, bytes]]) -> bytes:
    """A fatbin holding `images`, (kind "elf" or "ptx", sm, payload), uncompressed, laid out as nvcc's `-fatbin`
    (see `build.fatbin_entries`): each entry a header (u16 kind, u16 0x0101, u32 header size, u64 payload size,
    u32 compressed size 0, u32 address size (PTX: 64), u16 minor, u16 major (PTX: its ISA version; CUBIN: its
    ELF ABI version, major 1), u32 sm, u32 x2 name offset and length 0, u64 flags, u64 0, u64 uncompressed
    size 0; PTX then u32 options offset, u32 options length 0) and its payload padded to 8 bytes."""
    body = b""
    for kind, sm, payload in images:
        if kind == "elf":
            if payload[:4] != b"\x7fELF":
                raise BuildError("NVRTC's CUBIN is not an ELF")
            minor, major, addr, tail = payload[8], 1, 0, b""
        elif kind == "ptx":
            major, minor = _ptx_version(payload)
            addr, tail = 64, struct.pack("<II", 72, 0) + b"\0" * 8
        else:
            raise BuildError(f"unknown fatbin image kind {kind!r}")
        padded = payload + b"\0" * (-len(payload) % 8)
        header = struct.pack("<HHIQIIHHIIIQQQ", _KIND[kind], 0x0101, 64 + len(tail), len(padded), 0, addr, minor,
                             major, sm, 0, 0, _FLAGS_64BIT_LINUX, 0, 0) + tail
        body += header + padded
    return struct.pack("<IHHQ", _FATBIN_MAGIC, 1, 16, len(body)) + body
