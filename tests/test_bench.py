"""`evonnx bench` and `evonnx compare` (issue 11): the reports they write, a failed check as a failed result, and
compare's verdicts and exit codes. Timings here are short and only their presence is asserted; what they say is
for benchmarks, not tests."""

from __future__ import annotations

import copy
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import evonnx
from evonnx.cli import main

MODELS = Path(__file__).resolve().parents[1] / "models"
KEYS = {"model", "nodes_before", "nodes_after", "kernels", "fusion_ratio", "check", "ort_ms", "evonnx_ms", "speedup",
        "threads", "ort_p10_ms", "ort_p90_ms", "evonnx_p10_ms", "evonnx_p90_ms"}


def _bench(tmp_path: Path, *args: str) -> tuple[Any, dict[str, Any]]:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["bench", *args, "--seconds", "0.05", "--no-guard", "--json", str(out),
                                       "--markdown", str(tmp_path / "r.md"), "--junit", str(tmp_path / "r.xml")])
    return result, json.loads(out.read_text()) if out.is_file() else {}


def test_bench_writes_json_markdown_and_junit_per_model_and_thread_count(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("anchor_grid", "valid_flags"):
        shutil.copy(MODELS / f"{name}.onnx", folder)
    result, report = _bench(tmp_path, str(folder), "--threads", "1,2")
    assert result.exit_code == 0, result.output
    assert set(report["machine"]) >= {"cpu", "cores", "onnxruntime", "evonnx", "provider"}
    rows = report["models"]
    assert [(Path(r["model"]).name, r["threads"]) for r in rows] == [
        ("anchor_grid.onnx", 1), ("anchor_grid.onnx", 2), ("valid_flags.onnx", 1), ("valid_flags.onnx", 2)]
    for r in rows:
        assert KEYS <= set(r), KEYS - set(r)
        assert r["status"] == "ok" and r["check"]["passed"] is True and r["kernels"] >= 1
        assert r["nodes_after"] < r["nodes_before"] and 0 < r["fusion_ratio"] <= 1
        assert r["ort_p10_ms"] <= r["ort_ms"] <= r["ort_p90_ms"] and r["speedup"] == pytest.approx(
            r["ort_ms"] / r["evonnx_ms"])
        assert r["optimized"] == ""  # optimized into a temporary folder, removed
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert suite.get("tests") == "4" and suite.get("failures") == "0"
    assert len(suite.findall("testcase")) == 4 and not suite.findall("testcase/failure")
    table = (tmp_path / "r.md").read_text()
    assert table.count("anchor_grid.onnx") == 2 and "| passed |" in table
    assert not list(folder.glob("*.opt.onnx")) and not list(folder.glob("*.so"))  # nothing written beside them


def test_bench_takes_the_optimized_model_beside_it_and_a_failed_check_fails_the_run(tmp_path: Path) -> None:
    """X.opt.onnx beside X.onnx is checked and timed as it is; a library from another model fails the check:
    a "failed" result, a JUnit failure and exit 1, and the other model still gets its result."""
    for name in ("anchor_grid", "valid_flags"):
        shutil.copy(MODELS / f"{name}.onnx", tmp_path)
        evonnx.optimize(tmp_path / f"{name}.onnx", tmp_path / f"{name}.opt.onnx", guard=False)
    shutil.copy(tmp_path / "valid_flags.opt.evonnx.so", tmp_path / "anchor_grid.opt.evonnx.so")
    result, report = _bench(tmp_path, str(tmp_path / "anchor_grid.onnx"), str(tmp_path / "valid_flags.onnx"))
    assert result.exit_code == 1, result.output
    bad, good = report["models"]
    assert bad["status"] == "failed" and bad["check"]["passed"] is False and bad["speedup"] is None, bad
    assert good["status"] == "ok" and good["optimized"] == str(tmp_path / "valid_flags.opt.onnx"), good
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert suite.get("failures") == "1" and len(suite.findall("testcase/failure")) == 1
    assert "1 of 2 results failed" in result.output


def test_bench_bad_input_is_one_line(tmp_path: Path) -> None:
    result, report = _bench(tmp_path, str(tmp_path / "missing.onnx"))
    assert result.exit_code == 1 and report == {}
    assert result.output.strip().count("\n") == 0 and "no such file or folder" in result.output


def _report(speedup: float = 2.0, noise: float = 0.01, fusion: float = 0.8, status: str = "ok") -> dict[str, Any]:
    return {"machine": {}, "models": [
        {"model": "a.onnx", "threads": 1, "status": status, "message": "", "fusion_ratio": fusion, "kernels": 3,
         "speedup": speedup if status == "ok" else None, "noise": noise},
        {"model": "b.onnx", "threads": 1, "status": "ok", "message": "", "fusion_ratio": 0.5, "kernels": 1,
         "speedup": 1.5, "noise": 0.01}]}


def _compare(tmp_path: Path, base: Any, new: Any, *args: str) -> Any:
    paths = []
    for name, data in (("base.json", base), ("new.json", new)):
        p = tmp_path / name
        p.write_text(data if isinstance(data, str) else json.dumps(data))
        paths.append(str(p))
    return CliRunner().invoke(main, ["compare", *paths, *args, "--markdown", str(tmp_path / "c.md")])


@pytest.mark.parametrize(("new", "code", "verdict"), [
    (_report(), 0, "2 same"),
    (_report(speedup=2.02), 0, "2 same"),  # within the noise floor
    (_report(speedup=1.6), 1, "a.onnx [1 threads]: regressed: speedup 2.000x -> 1.600x"),
    (_report(speedup=1.6, noise=0.25), 0, "within noise"),  # a noisy run says nothing
    (_report(speedup=1.6), 0, "slower, within --max-slowdown 30%"),  # with --max-slowdown 30% (below)
    (_report(fusion=0.7), 1, "regressed: fusion 80% -> 70%"),
    (_report(fusion=0.79), 0, "fusion 80% -> 79%"),  # below --max-fusion-drop
    (_report(status="failed"), 1, "a.onnx [1 threads]: regressed: failed"),
    (_report(speedup=2.6), 0, "improved: speedup"),
])
def test_compare_verdicts_and_exit_codes(tmp_path: Path, new: dict[str, Any], code: int, verdict: str) -> None:
    wide = ("--max-slowdown", "30%") if "30%" in verdict else ()
    result = _compare(tmp_path, _report(), new, *wide)
    assert result.exit_code == code, result.output
    assert verdict in result.output
    assert (tmp_path / "c.md").read_text().startswith("### evonnx compare")


def test_compare_lists_a_model_in_one_report_only_without_failing(tmp_path: Path) -> None:
    new = copy.deepcopy(_report())
    new["models"][1]["model"] = "c.onnx"
    result = _compare(tmp_path, _report(), new)
    assert result.exit_code == 0, result.output
    assert "c.onnx [1 threads]: only in new" in result.output and "b.onnx [1 threads]: only in base" in result.output


@pytest.mark.parametrize(("base", "message"), [
    ("{not json", "not JSON"),
    ({"models": 3}, "not an evonnx bench report"),
    ({"models": [{"model": "a.onnx"}]}, "entry 0 of 'models' is not a bench result"),
    ({"models": [{"model": "a.onnx", "status": "ok", "speedup": "fast"}]}, "'speedup' is not a number"),
])
def test_compare_bad_report_exits_2_with_one_line(tmp_path: Path, base: Any, message: str) -> None:
    result = _compare(tmp_path, base, _report())
    assert result.exit_code == 2, result.output
    assert message in result.output and result.output.strip().count("\n") == 0
    assert not (tmp_path / "c.md").exists()
    missing = CliRunner().invoke(main, ["compare", str(tmp_path / "none.json"), str(tmp_path / "new.json")])
    assert missing.exit_code == 2 and "cannot read the report" in missing.output
    slow = _compare(tmp_path, _report(), _report(), "--max-slowdown", "five")
    assert slow.exit_code == 2 and "not a fraction" in slow.output


def test_bench_times_a_model_with_0d_inputs(tmp_path: Path) -> None:
    """EasyView's gen_base_anchors takes a 0-d base size: the timing run bound it as [1] (np.ascontiguousarray),
    which the kernel's rank check refused, an internal error of `optimize`'s guard and of bench alike."""
    result, report = _bench(tmp_path, str(MODELS / "easyview_gen_base_anchors.onnx"))
    assert result.exit_code == 0, result.output
    (row,) = report["models"]
    assert row["status"] == "ok" and row["speedup"] > 0, row
