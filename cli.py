"""The `evonnx` command line (click): parses arguments and calls the library; no logic of its own."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from evonnx.errors import EvonnxError


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise click.BadParameter(f"expected NAME=VALUE, got '{v}'", param_hint=what)
        out[name] = rest
    return out


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError as e:
        raise click.BadParameter(f"'{text}' is not a comma-separated list of integers", param_hint=what) from e


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.version_option(package_name="evonnx")
def main(verbose: int) -> None:
    """evonnx: view-aware fusion of ONNX post-processing into generated onnxruntime kernels."""
    logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2), format="%(levelname)s %(name)s: %(message)s")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Optimized model (default MODEL.opt.onnx).")
@click.option("--no-check", is_flag=True, help="Skip the comparison against onnxruntime (not recommended).")
@click.option("--dim", "dims", multiple=True, metavar="SYM=N", help="Size of a symbolic input dim for the check.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D0,D1,..",
              help="Shape of an input for the check.")
@click.option("--dump-dir", type=click.Path(path_type=Path), help="Write the plan, kernels and graph here.")
@click.option("--ort-headers", type=click.Path(path_type=Path), help="Folder with onnxruntime's C API headers.")
@click.option("--cflag", "cflags", multiple=True, help="Extra C compiler flag for the kernels (e.g. -march=native).")
@click.option("--planner", type=click.Choice(["search", "greedy"]), default="search", show_default=True,
              help="Fusion planner: cost-model search or TVM-style greedy.")
@click.option("--report", type=click.Path(path_type=Path), help="Write a JSON report (see README) here.")
@click.option("--target", type=click.Choice(["cpu", "cuda", "both"]), default=None,
              help="Kernels for onnxruntime's CPU EP, CUDA EP (needs nvcc), or both. "
                   "[default: both when a GPU is visible, else cpu]")
@click.option("--cuda-arch", "cuda_archs", default="sm_80,sm_90", show_default=True,
              help="CUDA architectures for the CUBINs (PTX for the newest is added).")
def optimize(model: Path, output: Path | None, no_check: bool, dims: tuple[str, ...], input_shapes: tuple[str, ...],
             dump_dir: Path | None, ort_headers: Path | None, cflags: tuple[str, ...], planner: str,
             report: Path | None, target: str | None, cuda_archs: str) -> None:
    """Fuse MODEL's view and elementwise chains; write the model and its kernel library (*.evonnx.so)."""
    from evonnx.api import optimize as run

    if target is None:
        from evonnx.kernels.build import cuda_device_count

        target = "both" if cuda_device_count() > 0 else "cpu"
    sizes = {k: _ints(v, "--dim")[0] for k, v in _pairs(dims, "--dim").items()}
    shapes = {k: _ints(v, "--input-shape") for k, v in _pairs(input_shapes, "--input-shape").items()}
    try:
        result = run(model, output, check=not no_check, dump_dir=dump_dir, cflags=cflags, ort_headers=ort_headers,
                     sizes=sizes or None, shapes=shapes or None, planner=planner, report=report, target=target,
                     cuda_archs=[a for a in cuda_archs.split(",") if a])
    except EvonnxError as e:
        click.echo(f"evonnx: error: {e}", err=True)
        sys.exit(1)
    click.echo(result.summary())


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
def explain(model: Path) -> None:
    """Say, node by node, why MODEL's nodes would or would not be fused."""
    from evonnx.explain import explain as run

    try:
        click.echo(run(model))
    except EvonnxError as e:
        click.echo(f"evonnx: error: {e}", err=True)
        sys.exit(1)


@main.command("build-runtime")
@click.option("--ort-headers", type=click.Path(path_type=Path), help="Folder with onnxruntime's C API headers.")
def build_runtime(ort_headers: Path | None) -> None:
    """Build the onnxruntime-facing part of the kernel library once for this install (otherwise done lazily)."""
    from evonnx.kernels.build import runtime_object

    try:
        click.echo(runtime_object(ort_headers))
    except EvonnxError as e:
        click.echo(f"evonnx: error: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
