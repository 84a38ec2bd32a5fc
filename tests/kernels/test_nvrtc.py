"""CUDA builds without the CUDA toolkit (issue 11): NVRTC from NVIDIA's wheel compiles the kernels nvcc would, and
`nvrtc.make_fatbin` packs them as nvcc does. Skipped where the NVRTC wheel is not installed (`evonnx[cuda]`)."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from evonnx.cli import main
from evonnx.errors import BuildError
from evonnx.kernels import build, nvrtc

pytestmark = pytest.mark.compiler

MODELS = Path(__file__).resolve().parents[2] / "models"
needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="no NVRTC 13 (pip install 'evonnx[cuda]')")


def _without_nvcc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A PATH holding only the C compilers, and no CUDA toolkit anywhere build looks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("gcc", "g++", "cc", "ld", "as"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    for var in ("EVONNX_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(build, "_DEFAULT_CUDA_ROOTS", (str(tmp_path),))
    with pytest.raises(BuildError, match="needs nvcc"):
        build.nvcc_path()


def _embedded_fatbin(library: Path) -> list[tuple[str, int]]:
    data = library.read_bytes()
    at = data.find(struct.pack("<I", 0xBA55ED50))
    assert at >= 0, "no fatbin in the library"
    return build.fatbin_contents(data[at:])


@needs_nvrtc
def test_target_both_with_nvrtc_builds_the_cuda_images_without_nvcc(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    _without_nvcc(monkeypatch, tmp_path)
    out = tmp_path / "m.opt.onnx"
    result = CliRunner().invoke(main, ["optimize", str(MODELS / "score_filter.onnx"), "-o", str(out), "--no-guard",
                                       "--target", "both", "--cuda-compiler", "nvrtc", "--cuda-arch", "sm_80,sm_90"])
    assert result.exit_code == 0, result.output
    assert sorted(_embedded_fatbin(tmp_path / "m.opt.evonnx.so")) == [("elf", 80), ("elf", 90), ("ptx", 90)]
    # auto: nvcc is not here, so NVRTC
    assert build.which_cuda_compiler("auto") == "nvrtc"


def test_no_cuda_compiler_at_all_names_both(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _without_nvcc(monkeypatch, tmp_path)
    monkeypatch.setattr(nvrtc, "_candidates", lambda: [tmp_path / "libnvrtc.so.13"])
    nvrtc.nvrtc.cache_clear()
    try:
        with pytest.raises(BuildError, match=r"needs nvcc .*or NVRTC: pip install 'evonnx\[cuda\]'"):
            build.cuda_fatbin('extern "C" __global__ void k() {}')
        with pytest.raises(BuildError, match="needs NVRTC 13"):
            build.cuda_fatbin('extern "C" __global__ void k() {}', compiler="nvrtc")
    finally:
        nvrtc.nvrtc.cache_clear()


@needs_nvrtc
def test_nvrtc_fatbin_entries_match_nvidias_fatbinary(tmp_path: Path) -> None:
    """The CUBIN entries `make_fatbin` writes are byte for byte those of NVIDIA's `fatbinary` for the same images;
    the PTX entry's header is too, but for its size (fatbinary strips the PTX's comments)."""
    fatbinary = shutil.which("fatbinary")
    if fatbinary is None:
        pytest.skip("no fatbinary (CUDA toolkit) to compare with")
    source = (MODELS.parent / "kernels" / "templates" / "prelude.cu").read_text().replace("$model", "t").replace(
        "$helpers", "").replace("$half", "#define EVO_HALF 1") + (  # NVRTC takes the float16 conversions' PTX too
        'extern "C" __global__ void k(float *o, int64_t n) { if (n > 0) o[0] = -evo_h2f(evo_f2h((float)NAN)); }\n')
    images = [("elf", 80, nvrtc.compile_image(source, "sm_80")), ("elf", 90, nvrtc.compile_image(source, "sm_90")),
              ("ptx", 90, nvrtc.compile_image(source, "compute_90"))]
    specs = []
    for kind, sm, payload in images:
        path = tmp_path / f"{kind}{sm}"
        path.write_bytes(payload)
        specs.append(f"--image3=kind={kind},sm={sm},file={path}")
    ref = tmp_path / "ref.fatbin"
    subprocess.run([fatbinary, f"--create={ref}", "-64", "--compress=false", *specs], check=True)
    mine, theirs = nvrtc.make_fatbin(images), ref.read_bytes()
    assert build.fatbin_contents(mine) == build.fatbin_contents(theirs) == [("elf", 80), ("elf", 90), ("ptx", 90)]
    cubins = 16 + sum(64 + len(p) + (-len(p) % 8) for k, _, p in images if k == "elf")
    assert mine[16:cubins] == theirs[16:cubins]
    assert mine[cubins:cubins + 8] == theirs[cubins:cubins + 8]  # kind, version, header size
    assert mine[cubins + 16:cubins + 80] == theirs[cubins + 16:cubins + 80]  # all but the payload size


@needs_nvrtc
def test_every_semantics_table_family_compiles_with_nvrtc(tmp_path: Path) -> None:
    """NVRTC has no C headers: the prelude's stand-ins must cover what the kernels of every fused op and element
    type use (the semantics table's models: elementwise, casts, reductions, Softmax, Where/Clip, views, scatters,
    generators, for every dtype), NaN and infinity constants in tables included."""
    import sys

    import onnx

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))
    from test_semantics_table import FAMILIES, TABLE

    from evonnx.kernels.codegen_cuda import generate_cuda
    from evonnx.model import load_model
    from evonnx.passes.pipeline import run_pipeline

    compiled = 0
    for dtype, family in TABLE:
        made = FAMILIES[family](dtype)
        assert made is not None
        path = tmp_path / f"{dtype}-{family}.onnx"
        onnx.save(made[0], str(path))
        specs = run_pipeline(load_model(path), planner="greedy").specs
        if specs:
            assert nvrtc.compile_image(generate_cuda(specs, path.name), "sm_90")[:4] == b"\x7fELF", (dtype, family)
            compiled += 1
    assert compiled >= 60, compiled
