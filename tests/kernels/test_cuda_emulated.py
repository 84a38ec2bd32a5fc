"""The generated CUDA kernels, run on the CPU: each model's .cu is compiled by g++ with a shim for the CUDA
keywords (cuda_emu.h) and every launch the host plan asks for runs one emulated thread at a time over a small grid,
so grid-stride loops wrap. Outputs must equal the CPU kernels' bit for bit (both are host code built without
contraction; kernels with transcendental functions within a few ulp, since the CPU kernels may use their own exp),
for the planned 32-bit variant and the forced 64-bit one, with outputs aligned and misaligned (the vector-store
path and its scalar fallback). Unwritten elements keep a sentinel and fail the comparison.

What this cannot check: nvcc's code generation, the GPU's libdevice math, the driver and launch itself.
"""

from __future__ import annotations

import ctypes
import functools
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from evonnx.index import Sym, evaluate
from evonnx.kernels.codegen_c import generate
from evonnx.kernels.codegen_cuda import _cuda_kernels, generate_cuda, generate_cuda_host
from evonnx.kernels.cprint import CTYPE
from evonnx.model import load_model
from evonnx.passes.pipeline import run_pipeline
from evonnx.records import KernelSpec

pytestmark = pytest.mark.compiler

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODELS = REPO / "models"
MANIFEST = {e["name"]: e for e in json.loads((MODELS / "manifest.json").read_text())["models"]}
RUNTIME_DIR = REPO / "kernels" / "runtime"
GRID = 3  # blocks of EVO_CUDA_BLOCK emulated threads: small, so the loops stride

_C_HELPERS = r"""
static void emu_serial_for(void *rt, evo_task_fn fn, void *data, size_t n) {
    (void)rt;
    for (size_t i = 0; i < n; ++i) fn(data, i);
}
int emu_infer(int k, const int64_t *const *in_dims, int64_t *const *out_dims, char *err) {
    const evo_kernel *e = evo_kernel_table[k];
    int32_t ranks[1024];
    if (e->num_outputs > 1024) return 1;
    for (int32_t o = 0; o < e->num_outputs; ++o) ranks[o] = e->output_ranks[o];
    return e->infer(in_dims, e->input_ranks, out_dims, ranks, err);
}
int emu_cpu(int k, const void *const *in, const int64_t *const *in_dims, void *const *out,
            const int64_t *const *out_dims, char *err) {
    const evo_kernel *e = evo_kernel_table[k];
    evo_args a;
    a.num_inputs = e->num_inputs;
    a.num_outputs = e->num_outputs;
    a.inputs = in;
    a.input_dims = in_dims;
    a.input_ranks = e->input_ranks;
    a.outputs = out;
    a.output_dims = out_dims;
    a.parallel_for = emu_serial_for;
    a.rt = 0;
    a.cpu_level = 1;
    return e->compute(&a, err);
}
int emu_plan(int k, const int64_t *const *in_dims, int64_t *syms, int32_t *entry, int64_t *total, char *err) {
    const evo_cuda_kernel *c = evo_kernel_table[k]->cuda;
    evo_cuda_launch l[256];
    if (c->num_launches > 256 || c->plan(in_dims, syms, l, err) != 0) return -1;
    for (int i = 0; i < c->num_launches; ++i) {
        entry[i] = l[i].entry;
        total[i] = l[i].total;
    }
    return c->num_launches;
}
const char *emu_entry(int k, int e) { return evo_kernel_table[k]->cuda->entries[e]; }
"""


def _dispatcher(specs: tuple[KernelSpec, ...]) -> str:
    lines = ["thread_local evo_emu_dim3 blockIdx, threadIdx, gridDim;", "typedef void (*emu_fn)(void **);"]
    table = []
    for spec, k in zip(specs, _cuda_kernels(specs), strict=True):
        casts = []
        n = 0
        for i in spec.inputs:
            t = f"const {CTYPE[i.dtype]} *" if i.dtype else "const void *"
            casts.append(f"*({t}*)p[{n}]")
            n += 1
        for o in spec.outputs:
            casts.append(f"*({CTYPE[o.dtype]} **)p[{n}]")
            n += 1
        for _ in range(len(k.syms) + 1):
            casts.append(f"*(long long *)p[{n}]")
            n += 1
        for piece in k.pieces:
            for w in ("i32", "i64"):
                name = f"{piece.fname}_{w}"
                lines.append(f"static void emu_{name}(void **p) {{ {name}({', '.join(casts)}); }}")
                table.append(f'    {{"{name}", emu_{name}}},')
    lines.append("static const struct { const char *name; emu_fn fn; } emu_table[] = {\n" + "\n".join(table) + "\n};")
    lines.append(r"""
#include <string.h>
extern "C" int emu_launch(const char *name, void **params, unsigned int grid) {
    for (const auto &e : emu_table) {
        if (strcmp(e.name, name) != 0) continue;
        gridDim = {grid, 1, 1};
        for (unsigned int b = 0; b < grid; ++b) {
            for (unsigned int t = 0; t < EVO_CUDA_BLOCK; ++t) {
                blockIdx = {b, 0, 0};
                threadIdx = {t, 0, 0};
                e.fn(params);
            }
        }
        return 0;
    }
    return -1;
}""")
    return "\n".join(lines) + "\n"


@functools.cache
def _specs(name: str) -> tuple[KernelSpec, ...]:
    return tuple(run_pipeline(load_model(MODELS / MANIFEST[name]["file"])).specs)


def _build(specs: tuple[KernelSpec, ...], work: Path) -> ctypes.CDLL:
    c_src = work / "kernels.c"
    c_src.write_text(generate(specs, "emu") + generate_cuda_host(specs) + _C_HELPERS)
    cu_src = work / "kernels_emu.cpp"
    cu_src.write_text(generate_cuda(specs, "emu") + _dispatcher(specs))
    c_obj, cu_obj, lib = work / "kernels.o", work / "kernels_emu.o", work / "emu.so"
    for cmd in (
        ["gcc", "-std=c11", "-O1", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-DEVO_WITH_CUDA",
         f"-I{RUNTIME_DIR}", "-c", str(c_src), "-o", str(c_obj)],
        ["g++", "-std=c++17", "-O1", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-Wno-unknown-pragmas",
         "-include", str(HERE / "cuda_emu.h"), "-c", str(cu_src), "-o", str(cu_obj)],
        ["g++", "-shared", "-o", str(lib), str(c_obj), str(cu_obj), "-lm"],
    ):
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-4000:]
    return ctypes.CDLL(str(lib))


def _ptrs(arrays: list[np.ndarray]) -> ctypes.Array:
    return (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])


def _dims_array(shapes: list[tuple[int, ...]]) -> tuple[ctypes.Array, list[np.ndarray]]:
    keep = [np.asarray(s if s else (0,), dtype=np.int64) for s in shapes]
    return (ctypes.POINTER(ctypes.c_int64) * max(1, len(keep)))(
        *[a.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) for a in keep]), keep


def _input(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if not dtype:
        return np.zeros(1, np.uint8)  # read only for its shape
    # np.asarray: a rank-0 input is a 0-d array (numpy's scalars have no buffer to hand the kernel)
    if dtype.startswith("float"):
        return np.asarray((rng.standard_normal(shape) * 3).astype(dtype))
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    return np.asarray(rng.integers(0, 8, size=shape).astype(dtype))


def _misaligned(shape: tuple[int, ...], dtype: np.dtype, shift: int) -> np.ndarray:
    """An array of `shape` whose data starts `shift` elements past a 64-byte boundary, filled with a sentinel."""
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.full((n + shift) * dtype.itemsize + 64, 0xA5, np.uint8)
    start = (-raw.ctypes.data) % 64 + shift * dtype.itemsize
    return raw[start: start + n * dtype.itemsize].view(dtype).reshape(shape)


def _sizes(spec: KernelSpec, syms: list[str], size: int) -> dict[str, int]:
    """Every size symbol `size`, then those the kernel's assumptions tie to others (3*H*W = N) set to match."""
    env = dict.fromkeys(syms, size)
    eqs = [(c.lhs, c.rhs) for c in spec.checks if c.kind == "bcast"]
    for a, b in eqs + [(b, a) for a, b in eqs]:
        atom = b.atom()
        if isinstance(atom, Sym) and not (a.syms() & {atom}):
            env[atom.name] = evaluate(a, env)
    assert all(evaluate(a, env) in (evaluate(b, env), 1) or evaluate(b, env) == 1 for a, b in eqs), spec.checks
    return env


@pytest.mark.parametrize("name", list(MANIFEST))
def test_emulated_cuda_kernels_match_cpu_kernels(name: str, tmp_path: Path) -> None:
    specs = _specs(name)
    lib = _build(specs, tmp_path)
    lib.emu_entry.restype = ctypes.c_char_p
    err = ctypes.create_string_buffer(512)
    for ki, (spec, kernel) in enumerate(zip(specs, _cuda_kernels(specs), strict=True)):
        syms = sorted({s.name for i in spec.inputs for d in i.shape for s in d.syms()})
        for size in (1, 5, 67):
            env = _sizes(spec, syms, size)
            shapes = [tuple(evaluate(d, env) for d in i.shape) for i in spec.inputs]
            rng = np.random.default_rng(size)
            inputs = [_input(rng, i.dtype, s) for i, s in zip(spec.inputs, shapes, strict=True)]
            in_dims, _keep_in = _dims_array(shapes)
            out_dims_buf = [np.zeros(16, np.int64) for _ in spec.outputs]
            out_dims = (ctypes.POINTER(ctypes.c_int64) * len(out_dims_buf))(
                *[a.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) for a in out_dims_buf])
            assert lib.emu_infer(ki, in_dims, out_dims, err) == 0, err.value.decode()
            out_shapes = [tuple(int(x) for x in b[: len(o.shape)]) for b, o in zip(out_dims_buf, spec.outputs,
                                                                                   strict=True)]
            want = [np.zeros(s, np.dtype(o.dtype)) for s, o in zip(out_shapes, spec.outputs, strict=True)]
            assert lib.emu_cpu(ki, _ptrs(inputs), in_dims, _ptrs(want), out_dims, err) == 0, err.value.decode()

            sym_vals = np.zeros(64, np.int64)
            entry = np.zeros(256, np.int32)
            total = np.zeros(256, np.int64)
            n = lib.emu_plan(ki, in_dims, sym_vals.ctypes.data_as(ctypes.c_void_p),
                             entry.ctypes.data_as(ctypes.c_void_p), total.ctypes.data_as(ctypes.c_void_p), err)
            assert n == len(kernel.pieces), err.value.decode()
            assert all(e % 2 == 0 for e in entry[:n]), "small sizes must take the 32-bit variants"
            for force64 in (False, True):
                for shift in (0, 1):
                    got = [_misaligned(s, np.dtype(o.dtype), shift) for s, o in zip(out_shapes, spec.outputs,
                                                                                    strict=True)]
                    values = [ctypes.c_void_p(a.ctypes.data) for a in inputs + got]
                    values += [ctypes.c_longlong(int(v)) for v in sym_vals[: len(kernel.syms)]]
                    count = ctypes.c_longlong(0)
                    params = (ctypes.c_void_p * (len(values) + 1))(
                        *[ctypes.addressof(v) for v in values], ctypes.addressof(count))
                    for e, t in zip(entry[:n], total[:n], strict=True):
                        if t <= 0:
                            continue
                        count.value = int(t)
                        launch = lib.emu_entry(ki, int(e) | int(force64))
                        assert lib.emu_launch(launch, params, GRID) == 0, launch
                    for o, w, g in zip(spec.outputs, want, got, strict=True):
                        what = f"{spec.name} output {o.name} size {size} 64-bit {force64} shift {shift}"
                        if spec.exact or w.dtype.kind not in "fc":
                            assert w.tobytes() == g.tobytes(), (
                                f"{what}: {np.argwhere(w.view(np.uint8) != g.view(np.uint8))[:3].tolist()} "
                                "bytes differ")
                        else:  # the CPU kernels may use their own exp (kernels/templates/prelude.c), CUDA expf
                            assert not (g.view(np.uint8) == 0xA5).all() or g.size == 0, what
                            finite = np.isfinite(w)
                            scale = float(np.abs(w[finite]).max()) if finite.any() else 1.0
                            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * max(1.0, scale), err_msg=what)
