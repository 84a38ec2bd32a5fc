"""The C compiler and the flags generated kernels are built with (shared by the build and the cost model)."""

from __future__ import annotations

import os
import shutil

# -ffp-contract=off: no fused multiply-add, so float results match onnxruntime's separate Mul and Add.
# -fno-math-errno: sqrt and friends never set errno; values are unchanged, and gcc may inline them.
# -fno-trapping-math: no floating-point trap is observed; values are unchanged, and gcc may if-convert selects
# (clamps, Where) so that loops vectorise (none did without it).
# -fopenmp-simd: honour `omp simd reduction` on reduction loops (vectorised reductions); no OpenMP runtime.
KERNEL_CFLAGS = ("-std=gnu11", "-O3", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off", "-fno-math-errno",
                 "-fno-trapping-math", "-fopenmp-simd")


def c_compiler() -> str | None:
    """`$CC`, else gcc, else cc; None when none is installed."""
    cc = os.environ.get("CC") or "gcc"
    return shutil.which(cc) or shutil.which("cc")
