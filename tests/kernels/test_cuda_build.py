"""The CUDA build without a GPU: every models/ kernel compiles for sm_80 and sm_90 (plus PTX), the fatbin lands in
the library as data, the library still needs no CUDA library and still runs on CPU-only onnxruntime, and the
hand-written driver types match cuda.h.

Compile time (2 cores): one nvcc run over every model's kernels takes ~10 s; a library per model ~1-3 s each.
nvcc results are cached by content (`<cache>/cuda`), so only the first run pays.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import subprocess
from pathlib import Path

import onnx
import pytest

from evonnx.api import _exact_outputs, library_path, optimize
from evonnx.errors import BuildError
from evonnx.index import Poly
from evonnx.kernels import build
from evonnx.kernels.codegen_c import generate
from evonnx.kernels.codegen_cuda import _cuda_kernels, generate_cuda, generate_cuda_host
from evonnx.model import load_model
from evonnx.passes.pipeline import run_pipeline
from evonnx.records import KernelSpec
from evonnx.verify import check_models

pytestmark = pytest.mark.compiler

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
MANIFEST = {e["name"]: e for e in json.loads((MODELS / "manifest.json").read_text())["models"]}
RUNTIME_SOURCE = Path(build.__file__).resolve().parent / "runtime" / "evonnx_ort.cc"


@functools.cache
def _nvcc() -> str | None:
    try:
        return str(build.nvcc_path())
    except BuildError:
        return None


needs_nvcc = pytest.mark.skipif(_nvcc() is None, reason="nvcc not found (CUDA toolkit)")


@functools.cache
def _specs(name: str) -> tuple[KernelSpec, ...]:
    return tuple(run_pipeline(load_model(MODELS / MANIFEST[name]["file"])).specs)


def _entries(specs: tuple[KernelSpec, ...]) -> list[str]:
    return [f"{p.fname}_{w}" for k in _cuda_kernels(specs) for p in k.pieces for w in ("i32", "i64")]


# -- every kernel of every model, in one nvcc run ---------------------------------------------------------------
@needs_nvcc
def test_cuda_kernels_of_every_model_compile_for_sm80_sm90_and_ptx() -> None:
    specs: list[KernelSpec] = []
    for m, name in enumerate(MANIFEST):  # one .cu: kernel names are per model, so prefix them
        specs += [dataclasses.replace(s, name=f"m{m}_{s.name}") for s in _specs(name)]
    assert specs
    image = build.cuda_fatbin(generate_cuda(specs, "every models/ model"), ("sm_80", "sm_90"))
    entries = build.fatbin_entries(image)
    assert sorted((kind, sm) for kind, sm, _ in entries) == [("elf", 80), ("elf", 90), ("ptx", 90)]
    names = _entries(tuple(specs))
    for kind, sm, payload in entries:
        if kind != "elf":
            continue  # nvcc compresses the PTX
        assert payload[:4] == b"\x7fELF" and payload[18] == 190  # EM_CUDA
        missing = [n for n in names if n.encode() + b"\0" not in payload]
        assert not missing, f"sm_{sm} CUBIN lacks {missing[:5]}"


# -- per model: the library with CUDA still runs on CPU onnxruntime -------------------------------------------------
def _symbols(lib: Path) -> dict[str, tuple[str, int, str]]:
    """name -> (section name or 'UND', size, binding) from readelf."""
    def readelf(flag: str) -> list[str]:
        result = subprocess.run(["readelf", flag, str(lib)], capture_output=True, text=True, check=True)
        return result.stdout.splitlines()

    sections = {}
    for line in readelf("-SW"):
        m = re.match(r"\s*\[\s*(\d+)\]\s+(\S+)", line)
        if m:
            sections[m.group(1)] = m.group(2)
    out = {}
    for line in readelf("-sW"):
        f = line.split()
        if len(f) >= 8 and f[0].endswith(":") and f[0] != "Num:":
            size = int(f[2], 16) if f[2].startswith("0x") else int(f[2])
            out[f[7]] = (sections.get(f[6], f[6]), size, f[4])
    return out


def _needed(lib: Path) -> list[str]:
    text = subprocess.run(["readelf", "-dW", str(lib)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\).*\[(.+)\]", text)


@needs_nvcc
@pytest.mark.parametrize("name", list(MANIFEST))
def test_cuda_library_embeds_the_image_and_runs_on_cpu(name: str, ort_headers: Path, tmp_path: Path) -> None:
    entry = MANIFEST[name]
    dst = tmp_path / f"{name}.opt.onnx"
    result = optimize(MODELS / entry["file"], dst, check=False, ort_headers=ort_headers)
    specs = result.kernels
    lib = library_path(dst)
    cpu_symbols = _symbols(lib)
    assert cpu_symbols.get("evo_cuda_image", ("UND",))[0] == "UND"  # a CPU build: weak and undefined

    source = generate(specs, dst.name) + generate_cuda_host(specs)
    cuda_source = generate_cuda(specs, dst.name)
    build.build_model_library(source, lib, model_name=dst.name, headers=ort_headers, cuda_source=cuda_source)
    image = build.cuda_fatbin(cuda_source)  # cached: the same bytes the build embedded
    symbols = _symbols(lib)
    assert symbols["evo_cuda_image"][:2] == (".rodata", len(image))
    assert symbols["evo_cuda_image_size"][0] == ".rodata"
    assert not [n for n in _needed(lib) if re.match(r"lib(cuda|cudart|nvrtc)", n)]
    assert image in lib.read_bytes()

    original = onnx.load(str(MODELS / entry["file"]))
    exact = _exact_outputs(onnx.load(str(dst)), specs)
    checked = check_models(original, dst, lib, exact, shapes=entry["checked_cases"][0])
    assert checked.compared > 0


# -- the host plans, compiled and called on the CPU ----------------------------------------------------------------
_PLAN_HARNESS = r"""
#include <stdio.h>
int main(int argc, char **argv) {
    const evo_kernel *k = evo_kernel_table[0];
    int64_t dims[EVO_MAX_RANK * 16];
    const int64_t *in_dims[16];
    int n = 0;
    for (int i = 0; i < k->num_inputs; ++i) {
        in_dims[i] = dims + n;
        for (int a = 0; a < k->input_ranks[i]; ++a, ++n) dims[n] = atoll(argv[1 + n]);
    }
    (void)argc;
    int64_t syms[64];
    evo_cuda_launch launches[256];
    char err[EVO_ERRLEN] = "";
    if (k->cuda->plan(in_dims, syms, launches, err) != 0) { printf("error %s\n", err); return 1; }
    for (int l = 0; l < k->cuda->num_launches; ++l)
        printf("%s %lld\n", k->cuda->entries[launches[l].entry], (long long)launches[l].total);
    return 0;
}
"""


def _run_plan(specs: tuple[KernelSpec, ...], dims: list[list[int]], tmp_path: Path) -> list[tuple[str, int]]:
    source = tmp_path / "plan.c"
    source.write_text("#include <stdlib.h>\n" + generate(specs, "plan") + generate_cuda_host(specs) + _PLAN_HARNESS)
    exe = tmp_path / "plan"
    subprocess.run(["gcc", "-std=c11", "-O1", "-DEVO_WITH_CUDA", f"-I{RUNTIME_SOURCE.parent}", str(source), "-o",
                    str(exe), "-lm"], check=True, capture_output=True)
    out = subprocess.run([str(exe), *[str(d) for shape in dims for d in shape]], capture_output=True, text=True,
                         check=True).stdout
    return [(line.split()[0], int(line.split()[1])) for line in out.splitlines()]


def _dims(spec: KernelSpec, size: int) -> list[list[int]]:
    from evonnx.index import evaluate

    syms = {s.name for i in spec.inputs for d in i.shape for s in d.syms()}
    return [[evaluate(d, dict.fromkeys(syms, size)) for d in i.shape] for i in spec.inputs]


# A size per model that makes the output exceed 2^31 elements while every total still fits int64.
_BIG = {"delta2bbox": 1 << 17, "yolo_decode": 1 << 17, "valid_flags": 1 << 16}


@pytest.mark.parametrize("name", list(_BIG))
def test_cuda_plan_picks_32_bit_indices_only_when_they_fit(name: str, tmp_path: Path) -> None:
    from evonnx.index import evaluate, product

    spec = _specs(name)[0]
    k = _cuda_kernels((spec,))[0]
    syms = {s.name for i in spec.inputs for d in i.shape for s in d.syms()}
    assert syms, "the test needs a model with a dynamic size"
    for size, width in ((8, "i32"), (_BIG[name], "i64")):
        env = dict.fromkeys(syms, size)
        sizes = [evaluate(product(o.shape), env) for o in spec.outputs]
        big = max(range(len(sizes)), key=lambda o: sizes[o])
        assert (sizes[big] >= 1 << 31) == (width == "i64")
        launches = _run_plan((spec,), _dims(spec, size), tmp_path)
        # the width is chosen per launch: the largest output's launches need 64 bits at the big size; at the
        # small size everything fits 32 bits
        for (n, _), p in zip(launches, k.pieces):
            if width == "i32" or f"_o{big}_" in p.fname:
                assert n == f"{p.fname}_{width}"
            else:
                assert n in (f"{p.fname}_i32", f"{p.fname}_i64")
        assert [t for _, t in launches] == [evaluate(p.total, env) for p in k.pieces]


# -- errors and the driver declarations ------------------------------------------------------------------------------
def test_cuda_build_without_nvcc_names_the_need(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EVONNX_NVCC", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "_DEFAULT_CUDA_ROOTS", (str(tmp_path),))
    with pytest.raises(BuildError, match="--target cuda needs nvcc"):
        build.cuda_fatbin("extern \"C\" __global__ void k() {}", compiler="nvcc")


def test_fatbin_parser_rejects_other_data() -> None:
    with pytest.raises(BuildError, match="not a fatbin"):
        build.fatbin_entries(b"\x7fELF" + bytes(60))


@needs_nvcc
def test_cuda_arch_list_is_checked() -> None:
    with pytest.raises(BuildError, match="not of the form sm_XY"):
        build.cuda_fatbin("extern \"C\" __global__ void k() {}", ("compute_80",))


def test_driver_types_match_cuda_h(ort_headers: Path, tmp_path: Path) -> None:
    include = build.cuda_include_dir()
    if include is None:
        pytest.skip("no CUDA toolkit include folder with cuda.h")
    result = subprocess.run(
        ["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", "-DEVO_CHECK_CUDA_H", f"-I{include}",
         f"-I{RUNTIME_SOURCE.parent}", f"-I{ort_headers}", str(RUNTIME_SOURCE)],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_cuda_index_width_bounds_the_positions_a_run_time_index_reads() -> None:
    """A piece's index type (32 or 64 bits) is chosen from every polynomial it computes: those inside a run-time
    position's value too (a Gather's indices read at 2^31 + j, past what the output's own positions need)."""
    from evonnx.expr import Load, Picked
    from evonnx.index import sym, var
    from evonnx.kernels.codegen_cuda import _nested

    j = var("j", sym("N"))
    far = j + (1 << 31)
    pos = Poly.of(Picked(Load(1, far, "int64"), sym("M")))
    assert far in _nested([pos]), "the run-time index's own read is not bounded"
