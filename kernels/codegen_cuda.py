"""CUDA code generation: device code (one .cu per model) and the host-side launch plans (plain C).

The iteration space of each output is split into the same *pieces* as the CPU kernels (`codegen_c.pieces`:
loops split at Concat boundaries, a small last axis unrolled with its elements sharing subexpressions). Each
piece becomes one `__global__` function running a grid-stride loop over its flattened work items, innermost axis
fastest: consecutive threads compute consecutive rows, so a warp's stores are contiguous (coalesced) whenever
the piece covers whole rows of the output.

- **Index width.** Each piece exists as `<name>_i32` and `<name>_i64` (one template body, index type `I`). The
  host plan bounds, in double arithmetic at run time, the magnitude of every index polynomial and every nested
  one (Mod, FloorDiv, Min, Max, table lookups) the piece evaluates, with every partial product and sum, and
  launches `_i32` only when that bound is below 2^31. The loop counter itself is always 64-bit.
- **Vector stores.** When a piece's unrolled elements are consecutive in the output and fill 4, 8 or 16 bytes
  (e.g. the 4 float coordinates of a box), the thread writes them with one vector store if the address is
  aligned, else element by element: the test is per thread, so any alignment is correct.
- **Loads are scalar**, through `const __restrict__` pointers (the read-only data path). The reads of fused
  view chains are mostly gathers (transposes, reshapes of strided views); where a thread reads a contiguous row,
  its scalar loads fall on the same 32-byte sectors the warp already fetched, so vector loads would save
  instructions, not memory traffic. Not done yet.
- **Rounding.** Compiled with `--fmad=false` (as the CPU kernels use `-ffp-contract=off`); division and sqrt
  are IEEE (nvcc's default `-prec-div=true -prec-sqrt=true`, no fast math), so exact kernels stay exact.
  Transcendentals use CUDA's libdevice (expf within 2 ulp): such kernels are inexact anyway.

`generate_cuda(specs, model)` returns the .cu source; `generate_cuda_host(specs)` returns C to append to the CPU
source of `codegen_c.generate` (compiled with `-DEVO_WITH_CUDA`, which makes each kernel entry point at its
`evo_cuda_kernel`). The entry order of both comes from the same `_cuda_kernels`, so they always agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from evonnx.expr import Expr, substitute, walk
from evonnx.index import Atom, FloorDiv, Foreign, Lookup, Max, Min, Mod, Poly, Sym, Var, is_nonneg, product, subs
from evonnx.kernels.cprint import CTYPE, Names, print_expr, print_poly
from evonnx.kernels.ctext import encode, lint
from evonnx.kernels.periodic import MAX_UNROLL
from evonnx.kernels.pieces import pieces
from evonnx.kernels.printing import (
    Tables,
    bind_symbols,
    half_define,
    helpers,
    kernel_symbols,
    node_list,
    template,
)
from evonnx.kernels.schedule import nonempty_view, piece_loops, polys, temporaries
from evonnx.kernels.share import Canon
from evonnx.records import KernelOutput, KernelSpec
from evonnx.view import View

_I32_LIMIT = "2147483647.0"
# Vector types nvcc stores in one instruction, by byte width.
_VECTOR = {4: "unsigned int", 8: "uint2", 16: "uint4"}
_SIZE = {"float32": 4, "float64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2,
         "uint32": 4, "uint64": 8, "bool": 1, "float16": 2}


@dataclass
class _CudaPiece:
    fname: str  # the __global__ base name; entries are fname + "_i32" / "_i64"
    device: str  # its CUDA source
    total: Poly  # work items (threads' loop range)
    bounded: tuple[Poly, ...]  # every index polynomial the piece evaluates, nested ones included


class _CudaKernel:
    """The CUDA pieces of one kernel, in the order of its launches."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.syms, self.sym_names = kernel_symbols(spec)  # as the CPU side names them, so both bind alike
        self.tables = Tables(spec.name, "__device__ ")
        self.pieces: list[_CudaPiece] = []
        self.canon = Canon()  # equal reductions as one expression (share.py), named as the CPU side names them
        for oi, o in enumerate(spec.outputs):
            o = nonempty_view(o)
            out_view = View.dense(o.shape)
            for pi, piece in enumerate(pieces(o)):
                self._add_piece(oi, o, pi, piece.ranges, out_view)

    # -- one piece --------------------------------------------------------------------------------------
    def _add_piece(self, oi: int, o: KernelOutput, pi: int, ranges: tuple[tuple[Poly, Poly], ...],
                   out_view: View) -> None:
        # The loops of the piece as the CPU generator builds them: one per axis of extent > 1, split where the
        # expression divides them (schedule._split_axes: a flattened Reshape becomes nested loops again, so the
        # per-element fdiv/fmod disappear); a small last loop is unrolled, the rest flattened into work items.
        loops, expr, pos = piece_loops(o, ranges, out_view)
        exts: list[Poly] = [lp.atom().extent for lp in loops]  # type: ignore[union-attr]
        unroll = None
        if loops and exts[-1].const is not None and exts[-1].const <= MAX_UNROLL:
            unroll = loops.pop().atom()
            exts.pop()
        cvars: dict[Var, str] = {}
        for n, lp in enumerate(loops):
            cvars[lp.atom()] = f"c{n}"  # type: ignore[index]
        roots: list[tuple[Poly, Expr]] = []
        for u in range(unroll.extent.const if isinstance(unroll, Var) else 1):  # type: ignore[arg-type]
            m = {unroll: Poly.of(u)} if unroll is not None else {}
            roots.append((subs(pos, m), self.canon(substitute(expr, m))))
        for _, e in roots:
            self.tables.collect(e)
        names = Names(cvars, self.sym_names, self.tables.names, index_type="I")
        fname = f"{self.spec.name}_o{oi}_p{pi}"
        total = product(exts)
        note = "[" + ", ".join(f"{lo}:{hi}" for lo, hi in ranges) + "), work items " + " x ".join(
            f"{cvars[lp.atom()]}<{e}" for lp, e in zip(loops, exts, strict=True))  # type: ignore[index]
        if isinstance(unroll, Var):
            note += f", {unroll.extent} unrolled"
        params, args = self._params()
        device = template("piece.cu").substitute(
            kernel=self.spec.name, output=oi, tensor=encode(o.name), piece=pi, extent_note=encode(note, limit=400),
            fname=fname,
            params=params, args=args, bindings=self._bindings(exts, names), unravel=_unravel(len(exts)),
            body=_body(roots, names, oi, o.dtype))
        bounded: list[Poly] = [total, *exts]
        for p_, e in roots:
            bounded.append(p_)
            for x in walk(e):
                bounded.extend(polys(x))
        self.pieces.append(_CudaPiece(fname, device, total, tuple(_nested(bounded))))

    def _params(self) -> tuple[str, str]:
        params, args = [], []
        for k, i in enumerate(self.spec.inputs):
            params.append(f"const {CTYPE[i.dtype]} *__restrict__ in{k}" if i.dtype else f"const void *in{k}")
            args.append(f"in{k}")
        for k, o in enumerate(self.spec.outputs):
            params.append(f"{CTYPE[o.dtype]} *__restrict__ out{k}")
            args.append(f"out{k}")
        for n in range(len(self.syms)):
            params.append(f"long long sym{n}")
            args.append(f"sym{n}")
        params.append("long long total")
        args.append("total")
        return ", ".join(params), ", ".join(args)

    def _bindings(self, exts: Sequence[Poly], names: Names) -> str:
        lines = [f"    const I {self.sym_names[s]} = (I)sym{n};\n    (void){self.sym_names[s]};"
                 for n, s in enumerate(self.syms)]
        for n in range(1, len(exts)):  # the outermost needs no extent: it is what remains of the flat index
            lines.append(f"    const I e{n} = {print_poly(exts[n], names)};")
        for k in range(len(self.spec.inputs)):
            lines.append(f"    (void)in{k};")
        return "\n".join(lines)


def _nested(polys: Sequence[Poly]) -> list[Poly]:
    """Every distinct polynomial that evaluating `polys` computes, nested ones (inside atoms) included, those a
    run-time position's value reads too (they are computed in the piece's index type as well).

    A Var's extent is not computed by the code (the loop coordinate is), so it is not listed; `_mag` still uses it
    to bound the Var."""
    out: dict[Poly, None] = {}
    stack = list(polys)
    while stack:
        p = stack.pop()
        if p in out or p.const is not None:
            continue
        out[p] = None
        for mono, _ in p.terms:
            for a in mono:
                if isinstance(a, (FloorDiv, Mod)):
                    stack.extend((a.num, a.den))
                elif isinstance(a, (Min, Max)):
                    stack.extend((a.a, a.b))
                elif isinstance(a, Lookup):
                    stack.append(a.index)
                elif isinstance(a, Foreign):  # a run-time position: its dim and the indices its value reads
                    stack.extend(a.children())
    return sorted(out, key=str)


def _mag(p: Poly, names: Names) -> str:
    """C (double) for an upper bound of |p| and of every partial product and sum the generated code forms."""
    terms = []
    for mono, c in p.terms:
        terms.append("*".join([f"{abs(c)}.0"] + [f"fmax(1.0, {_amag(a, names)})" for a in mono]))
    return "(" + " + ".join(terms) + ")" if terms else "0.0"


def _amag(a: Atom, names: Names) -> str:
    if isinstance(a, Sym):
        return f"(double){names.syms[a]}"
    if isinstance(a, Var):
        return _mag(a.extent, names)
    if isinstance(a, FloorDiv):  # |floor(n / d)| <= |n| for integers with d != 0
        return _mag(a.num, names)
    if isinstance(a, Mod):  # |fmod(n, d)| < |d|
        return _mag(a.den, names)
    if isinstance(a, Min):
        # min(x, c) of a size x >= 0 and a constant c >= 0 lies in [0, c] (broadcast sizes have min(.., 1))
        for x, y in ((a.a, a.b), (a.b, a.a)):
            if y.const is not None and y.const >= 0 and is_nonneg(x):
                return f"{y.const}.0"
    if isinstance(a, (Min, Max)):
        x, y = (a.a, a.b)
        return f"fmax({_mag(x, names)}, {_mag(y, names)})"
    if isinstance(a, Lookup):
        return f"{max(abs(v) for v in a.table.values)}.0"
    raise TypeError(f"cannot bound atom {a!r}")


def _unravel(n: int) -> str:
    """The work coordinates c0..c<n-1> of flat work item f, the last fastest."""
    if n == 0:
        return "        (void)f;"
    lines = ["        I r = (I)f;"]
    for k in range(n - 1, 0, -1):
        lines.append(f"        const I c{k} = r % e{k};\n        r /= e{k};")
    lines.append("        const I c0 = r;")
    return "\n".join(lines)


def _body(roots: Sequence[tuple[Poly, Expr]], names: Names, oi: int, dtype: str) -> str:
    """Statements computing every root, with the CPU generator's temporaries (`schedule.temporaries`), then
    the stores, vectorised when the roots are consecutive and fill a vector type."""
    temps: dict[Expr, str] = {}
    lines: list[str] = []

    def sub(x: Expr) -> str:
        if x in temps:
            return temps[x]
        return print_expr(x, names, sub)

    for x, _ in temporaries(roots, None):  # one thread computes one row: nothing is hoisted further
        code = print_expr(x, names, sub)
        name = f"t{len(temps)}"
        lines.append(f"        const {CTYPE[x.dtype]} {name} = {code};")
        temps[x] = name
    t = CTYPE[dtype]
    n = len(roots)
    width = n * _SIZE[dtype]
    consecutive = all((pos - roots[0][0]).const == u for u, (pos, _) in enumerate(roots))
    if n > 1 and consecutive and width in _VECTOR:
        vt = _VECTOR[width]
        lines.append(f"        union {{ {t} e[{n}]; {vt} v; }} w;")
        for u, (_, e) in enumerate(roots):
            lines.append(f"        w.e[{u}] = ({t})({sub(e)});")
        lines.append(f"        {t} *p = out{oi} + {print_poly(roots[0][0], names)};")
        lines.append(f"        if ((reinterpret_cast<uintptr_t>(p) & {width - 1}u) == 0) {{\n"
                     f"            *reinterpret_cast<{vt} *>(p) = w.v;\n        }} else {{")
        for u in range(n):
            lines.append(f"            p[{u}] = w.e[{u}];")
        lines.append("        }")
    else:
        for pos, e in roots:
            lines.append(f"        out{oi}[{print_poly(pos, names)}] = ({t})({sub(e)});")
    return "\n".join(lines)


def _cuda_kernels(specs: Sequence[KernelSpec]) -> list[_CudaKernel]:
    return [_CudaKernel(s) for s in specs]


# -- device code --------------------------------------------------------------------------------------------
def _device_source(k: _CudaKernel) -> str:
    spec = k.spec
    io = [f" * in{si}: {encode(i.name)} {i.dtype}[{encode(', '.join(map(str, i.shape)), limit=240)}]"
          for si, i in enumerate(spec.inputs)]
    for oi, o in enumerate(spec.outputs):
        io.append(f" * out{oi}: {encode(o.name)} {o.dtype}[{encode(', '.join(map(str, o.shape)), limit=240)}] reads "
                  + encode("; ".join(o.reads), limit=400))
    return template("kernel.cu").substitute(
        kernel=spec.name, nodes=node_list(spec.source_nodes), ops=encode(" ".join(spec.source_ops), limit=400),
        io_comment="\n".join(io), tables=k.tables.text(),
        pieces="".join(p.device for p in k.pieces))


def generate_cuda(specs: Sequence[KernelSpec], model_name: str) -> str:
    """The CUDA source of every kernel of one model: two `extern "C" __global__` functions per piece."""
    parts = [template("prelude.cu").substitute(model=encode(model_name), helpers=helpers(),
                                               half=half_define(specs))]
    parts.extend(_device_source(k) for k in _cuda_kernels(specs))
    source = "".join(parts)
    lint(source, f"CUDA kernels of {encode(model_name)}")
    return source


# -- host code ----------------------------------------------------------------------------------------------
def _host_source(k: _CudaKernel) -> str:
    spec = k.spec
    names = Names({}, k.sym_names, {})
    _, sym_binding = bind_symbols(spec, k.syms, k.sym_names)
    sym_fill = "\n".join(f"    syms[{n}] = {k.sym_names[s]};" for n, s in enumerate(k.syms))
    launches = []
    for n, p in enumerate(k.pieces):
        bounds = [_mag(q, names) for q in p.bounded] or ["0.0"]
        expr = bounds[0]
        for b in bounds[1:]:
            expr = f"fmax({expr},\n                 {b})"
        launches.append(
            f"    bound = {expr};\n"
            f"    launches[{n}].entry = bound <= {_I32_LIMIT} ? {2 * n} : {2 * n + 1};\n"
            f"    launches[{n}].total = {print_poly(p.total, names)};")
    entries = ",\n".join(f"    \"{p.fname}_i32\", \"{p.fname}_i64\"" for p in k.pieces)
    return template("cuda_host.c").substitute(
        kernel=spec.name, entries=entries, sym_binding=sym_binding, sym_fill=sym_fill,
        launches="\n".join(launches), n_entries=2 * len(k.pieces), n_launches=len(k.pieces),
        n_syms=len(k.syms))


def generate_cuda_host(specs: Sequence[KernelSpec]) -> str:
    """C to append to `codegen_c.generate(specs, ...)`: each kernel's `evo_cuda_kernel` with its launch plan.

    The combined source must be compiled with `-DEVO_WITH_CUDA` (build_model_library does so when it is given
    the CUDA source), which makes each kernel's entry point at the table defined here."""
    parts = ["\n/* ---- CUDA launch plans (codegen_cuda.generate_cuda_host) ---- */\n"
             "#ifndef EVO_WITH_CUDA\n#error \"the CUDA host code needs -DEVO_WITH_CUDA\"\n#endif\n"]
    parts.extend(_host_source(k) for k in _cuda_kernels(specs))
    source = "".join(parts)
    lint(source, "CUDA launch plans")
    return source

