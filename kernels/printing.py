"""What the C and CUDA printers share, so neither borrows from the other: the templates, a kernel's size
symbols and their C names, its constant tables, where each size is read at run time, and the header comment."""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence
from pathlib import Path
from string import Template

from evonnx.expr import HALF, Expr, ValueTable, walk
from evonnx.index import Sym, Table
from evonnx.kernels.cprint import CTYPE, print_const
from evonnx.kernels.ctext import encode
from evonnx.kernels.schedule import deep_walk, polys, tables_in
from evonnx.records import KernelSpec

TEMPLATES = Path(__file__).with_name("templates")


def template(name: str) -> Template:
    return Template((TEMPLATES / name).read_text())


def helpers() -> str:
    """The element helpers both preludes share (templates/helpers.h), inlined so each source stands alone."""
    return (TEMPLATES / "helpers.h").read_text()


def half_define(specs: Sequence[KernelSpec]) -> str:
    """`#define EVO_HALF 1` where a kernel loads, stores or converts float16 (the preludes then define evo_half and
    its conversions, an extension of C11 that only such a library needs), else nothing."""
    uses = any(i.dtype == HALF for s in specs for i in s.inputs) or any(
        x.dtype == HALF for s in specs for o in s.outputs for x in deep_walk(o.expr))
    return "#define EVO_HALF 1" if uses else ""


def kernel_symbols(spec: KernelSpec) -> tuple[list[Sym], dict[Sym, str]]:
    """Every size symbol the kernel's shapes, expressions and checks use, sorted by name, and its C name (`s0`,
    `s1`, ...): the same on the CPU and the CUDA side, so both bind alike."""
    syms: set[Sym] = set()
    for i in spec.inputs:
        for d in i.shape:
            syms |= d.syms()
    for o in spec.outputs:
        for d in o.shape:
            syms |= d.syms()
        for x in walk(o.expr):
            for p in polys(x):
                syms |= p.syms()
    for c in spec.checks:
        syms |= c.lhs.syms() | c.rhs.syms() | (c.unless.syms() if c.unless is not None else set())
    ordered = sorted(syms, key=lambda s: s.name)
    return ordered, {s: f"s{k}" for k, s in enumerate(ordered)}


class Tables:
    """A kernel's constant tables (index lookups, value tables), each declared once as a static array named
    `<kernel>_t<k>`; `qualifier` places them (`__device__ ` for CUDA global memory)."""

    def __init__(self, kernel: str, qualifier: str = ""):
        self.kernel = kernel
        self.qualifier = qualifier
        self.names: dict[object, str] = {}
        self.decls: list[str] = []

    def name(self, t: Table | ValueTable) -> str:
        if t not in self.names:
            name = f"{self.kernel}_t{len(self.names)}"
            self.names[t] = name
            if isinstance(t, Table):
                ctype, vals = "int64_t", ", ".join(f"INT64_C({v})" for v in t.values)
            else:
                ctype, vals = CTYPE[t.dtype], ", ".join(print_const(v, t.dtype) for v in t.values)
            self.decls.append(f"static {self.qualifier}const {ctype} {name}[{len(t.values)}] = {{{vals}}};")
        return self.names[t]

    def collect(self, e: Expr) -> None:
        for t in tables_in(e):
            self.name(t)

    def text(self) -> str:
        return "\n".join(self.decls) + ("\n" if self.decls else "")


def bind_symbols(spec: KernelSpec, syms: Sequence[Sym],
                 sym_names: dict[Sym, str]) -> tuple[dict[Sym, tuple[int, int]], str]:
    """Where each size symbol is read at run time, (input slot, axis) of its first bare occurrence, and the C
    statements reading them from `in_dims`. Shared by the CPU kernels and the CUDA host plan."""
    binding: dict[Sym, tuple[int, int]] = {}
    for si, i in enumerate(spec.inputs):
        for a, d in enumerate(i.shape):
            s = d.atom()
            if isinstance(s, Sym) and s not in binding:
                binding[s] = (si, a)
    missing = [s.name for s in syms if s not in binding]
    if missing:
        raise ValueError(f"kernel {spec.name}: size symbols {missing} are bound by no input")
    return binding, "\n".join(f"    const int64_t {sym_names[s]} = in_dims[{binding[s][0]}][{binding[s][1]}];"
                              for s in syms)


def node_list(nodes: Sequence[str]) -> str:
    """The source nodes for a kernel's header comment: encoded names, the first few of a long list."""
    shown = ", ".join(encode(n) for n in nodes[:8])
    return shown + (f", ... {len(nodes) - 8} more" if len(nodes) > 8 else "")


_LOCAL = re.compile(r"^ {4,}(?:const )?[A-Za-z_][A-Za-z0-9_]*(?: \*restrict | \*const \*| \*| )"
                    r"([A-Za-z_][A-Za-z0-9_]*) = [^;]*;$")


def drop_unused_locals(text: str) -> str:
    """`text` (C functions, each closed by a `}` in column 0) without the local declarations its function never
    reads: a piece binds only the inputs, outputs and sizes it uses, and the source compiles with -Wall -Wextra
    warning-free, with no pragma silencing -Wunused. Declarations have no side effects (they read the context)."""
    out: list[str] = []
    for chunk in re.split(r"(?m)(?<=^}\n)", text):
        lines = chunk.split("\n")
        while True:
            code = re.sub(r'/\*.*?\*/|"(?:[^"\\\n]|\\.)*"', " ", chunk, flags=re.S)  # no comments, strings
            words = collections.Counter(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code))
            dead = {k for k, ln in enumerate(lines) if (m := _LOCAL.match(ln)) and words[m.group(1)] == 1}
            if not dead:
                break
            lines = [ln for k, ln in enumerate(lines) if k not in dead]
            chunk = "\n".join(lines)
        out.append(chunk)
    return "".join(out)
