"""The C compiler and the flags generated kernels are built with (shared by the build and the cost model)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

# -ffp-contract=off: no fused multiply-add, so float results match onnxruntime's separate Mul and Add.
# -fno-math-errno: sqrt and friends never set errno; values are unchanged, and gcc may inline them.
# -fno-trapping-math: no floating-point trap is observed; values are unchanged, and gcc may if-convert selects
# (clamps, Where) so that loops vectorise (none did without it).
# -fopenmp-simd: honour `omp simd reduction` on reduction loops (vectorised reductions); no OpenMP runtime.
KERNEL_CFLAGS = ("-std=gnu11", "-O3", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off", "-fno-math-errno",
                 "-fno-trapping-math", "-fopenmp-simd")


# gcc only: no vectorised epilogue after a vectorised loop. The epilogue runs fewer iterations than one vector
# holds (at most 3 floats with SSE2), so it costs next to nothing at run time, but vectorising it again is a third
# of the build time of a large kernels.c (benchmarks/plan_scaling.py, "wide" at 5000 nodes: 29 s -> 19.5 s
# single-threaded, gcc 12).
GCC_ONLY_CFLAGS = ("--param=vect-epilogues-nomask=0",)


@functools.lru_cache(maxsize=8)
def is_gcc(cc: str) -> bool:
    """Whether `cc` is GCC itself (not clang, which also answers to gcc-style flags but not to gcc's --param)."""
    try:
        out = subprocess.run([cc, "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "#define __GNUC__" in out and "__clang__" not in out and "__INTEL_COMPILER" not in out


def kernel_cflags(cc: str) -> tuple[str, ...]:
    """The flags for kernel sources compiled with `cc`."""
    return KERNEL_CFLAGS + (GCC_ONLY_CFLAGS if is_gcc(cc) else ())


def c_compiler() -> str | None:
    """`$CC`, else gcc, else cc; None when none is installed."""
    cc = os.environ.get("CC") or "gcc"
    return shutil.which(cc) or shutil.which("cc")


# What x86-64-v3 adds to the baseline, as Linux names the CPU flags (lzcnt is "abm").
_V3_FLAGS = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})


@functools.cache
def cpu_runs_v3() -> bool:
    """Whether this machine runs the x86-64-v3 variant of the CPU kernels (prelude.c, EVO_PICK), so that the check
    can run it as well as the baseline one. A library built where this is False carries the baseline variant only:
    nothing a serving machine runs goes unchecked."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return _V3_FLAGS <= set(line.partition(":")[2].split())
    except OSError:
        pass
    return False
