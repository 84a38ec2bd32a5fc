"""The benchmark plot (issue 12): each models/ model's time, optimized, as a multiple of its floor.

    .venv/bin/python benchmarks/plot.py --cpu cpu.json --gpu gpu.json --out benchmarks/results/floor.png

`--cpu` takes the JSON report of benchmarks/cpu.py (`--json`; `cpu.py --plot PNG` calls this directly), whose
floor is the memory bandwidth floor of the model's bytes in and out, one bar per thread count; `--gpu` that of
benchmarks/gpu.py, whose floor is one onnxruntime node over the same bytes on the device. The vertical lines are
issue 12's targets: 3x the floor on the CPU at 1 thread, 1.5x the one-node floor on the GPU. Needs matplotlib
(`pip install 'evonnx[plot]'`); nothing else here does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CPU_TARGET = 3.0  # issue 12: within 3x of its floor at 1 thread (models with a floor of at least 20 us)
GPU_TARGET = 1.5  # issue 12: within 1.5x of the one-node floor
MIN_FLOOR_US = 20.0  # below this the CPU target does not apply (the plot marks such models)


def cpu_points(report: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    """Per model of a cpu.py report (in its order), evonnx's median over the floor per thread count; models
    whose optimization failed have no entry."""
    out: dict[str, dict[int, float]] = {}
    for m in report.get("models", []):
        per = {int(t["threads"]): float(t["evonnx_over_floor"]) for t in m.get("threads", [])
               if t.get("evonnx_over_floor") is not None}
        if per:
            out[m["name"]] = per
    return out


def cpu_floors(report: Mapping[str, Any]) -> dict[str, float]:
    return {m["name"]: float(m["floor"]["floor_us"]) for m in report.get("models", []) if m.get("floor")}


def gpu_points(report: Mapping[str, Any]) -> dict[str, float]:
    """Per model of a gpu.py report, the optimized median over the one-node floor."""
    return {r["name"]: float(r["optimized"]["median_us"]) / float(r["floor_us"]) for r in report.get("results", [])
            if r.get("floor_us")}


def write_plot(cpu: Mapping[str, Any] | None, gpu: Mapping[str, Any] | None, out: Path, title: str = "") -> None:
    """A PNG at `out`: one panel per report given, a horizontal bar per model (and thread count), log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels: list[tuple[str, list[str], list[tuple[str, list[float]]], float]] = []
    if cpu is not None:
        pts, floors = cpu_points(cpu), cpu_floors(cpu)
        names = list(pts)
        threads = sorted({t for p in pts.values() for t in p})
        labels = [f"{n}{'' if floors.get(n, MIN_FLOOR_US) >= MIN_FLOOR_US else ' *'}" for n in names]
        series = [(f"CPU, {t} thread{'s' if t > 1 else ''}", [pts[n].get(t, float("nan")) for n in names])
                  for t in threads]
        panels.append(("onnxruntime CPU EP: evonnx / bandwidth floor (* floor < 20 us)", labels, series,
                       CPU_TARGET))
    if gpu is not None:
        g = gpu_points(gpu)
        panels.append(("CUDA EP: evonnx / one-node floor", list(g), [("GPU", list(g.values()))], GPU_TARGET))
    if not panels:
        raise ValueError("no report to plot")
    rows = max(len(p[1]) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 0.32 * rows + 1.6), squeeze=False)
    for ax, (name, labels, series, target) in zip(axes[0], panels, strict=True):
        height = 0.8 / len(series)
        for k, (label, values) in enumerate(series):
            ys = [i + (k - (len(series) - 1) / 2) * height for i in range(len(labels))]
            ax.barh(ys, values, height=height, label=label)
        ax.axvline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:g}x")
        ax.axvline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}x" if f"{v:g}"[0] in "25" else ""))
        ax.tick_params(axis="x", which="both", labelsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("time / floor (log)")
        ax.legend(fontsize=7, loc="best", framealpha=0.9)
        ax.grid(axis="x", which="both", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(str(out), dpi=110)
    plt.close(fig)


def _load(path: str | None) -> dict[str, Any] | None:
    return json.loads(Path(path).read_text()) if path else None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", help="a benchmarks/cpu.py --json report")
    p.add_argument("--gpu", help="a benchmarks/gpu.py --json report")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    if not (args.cpu or args.gpu):
        print("benchmarks/plot.py: give --cpu, --gpu or both", file=sys.stderr)
        return 2
    try:
        write_plot(_load(args.cpu), _load(args.gpu), Path(args.out), args.title)
    except ImportError:
        print("benchmarks/plot.py: needs matplotlib (pip install 'evonnx[plot]')", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
