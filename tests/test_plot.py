"""The benchmark plot (issue 12): benchmarks/plot.py reads the JSON reports of benchmarks/cpu.py and gpu.py and
draws each model's time over its floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.plot import cpu_points, gpu_points, main, write_plot

CPU = {"models": [
    {"name": "a", "floor": {"floor_us": 100.0}, "threads": [{"threads": 1, "evonnx_over_floor": 2.5},
                                                           {"threads": 2, "evonnx_over_floor": 1.4}]},
    {"name": "b", "floor": {"floor_us": 0.5}, "threads": [{"threads": 1, "evonnx_over_floor": 40.0}]},
    {"name": "broken", "error": "optimize failed"}]}
GPU = {"results": [{"name": "a", "optimized": {"median_us": 30.0}, "floor_us": 20.0}]}


def test_points_are_each_models_median_over_its_floor() -> None:
    assert cpu_points(CPU) == {"a": {1: 2.5, 2: 1.4}, "b": {1: 40.0}}  # the failed model has no bar
    assert gpu_points(GPU) == {"a": 1.5}


def test_write_plot_writes_a_png_of_both_panels(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the dev and plot extras install it)")
    out = tmp_path / "floor.png"
    write_plot(CPU, GPU, out, "title")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    assert width > 1000, width  # two panels side by side
    with pytest.raises(ValueError, match="no report"):
        write_plot(None, None, out)


def test_main_needs_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path / "x.png")]) == 2
    assert "give --cpu, --gpu or both" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_main_plots_a_cpu_report(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the dev and plot extras install it)")
    report = tmp_path / "cpu.json"
    report.write_text(json.dumps(CPU))
    assert main(["--cpu", str(report), "--out", str(tmp_path / "x.png")]) == 0
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"
