"""The `evonnx` command line: bad input fails with one line naming the problem and writes nothing; the happy path
writes the model and its library and says what it did."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from evonnx.cli import main
from evonnx.model import opset_max

ROOT = Path(__file__).resolve().parents[1]
SMALL_MODEL = ROOT / "models" / "gen_base_anchors.onnx"  # 39 nodes, static shapes


def _model(opset: int = 17, nodes: list[onnx.NodeProto] | None = None, domain_opsets: dict[str, int] | None = None
           ) -> onnx.ModelProto:
    nodes = nodes if nodes is not None else [helper.make_node("Neg", ["x"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                          initializer=[numpy_helper.from_array(np.ones((2, 3), np.float32), "one")])
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domain_opsets or {}).items()]
    return helper.make_model(g, opset_imports=imports, ir_version=8)


def _write(path: Path, model: onnx.ModelProto) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


BadInput = Callable[[Path], tuple[Path, str]]


def _missing(d: Path) -> tuple[Path, str]:
    return d / "nope.onnx", "no such file"


def _truncated(d: Path) -> tuple[Path, str]:
    p = d / "truncated.onnx"
    p.write_bytes(SMALL_MODEL.read_bytes()[:100])
    return p, "not a readable ONNX model"


def _random_bytes(d: Path) -> tuple[Path, str]:
    p = d / "random.onnx"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    return p, "not a readable ONNX model"


def _undefined_input(d: Path) -> tuple[Path, str]:
    model = _model(nodes=[helper.make_node("Add", ["x", "ghost"], ["y"])])
    return _write(d / "undefined.onnx", model), "fails the ONNX checker"


def _opset_too_old(d: Path) -> tuple[Path, str]:
    return _write(d / "opset6.onnx", _model(opset=6)), "opset 6 is outside"  # below onnxruntime's oldest, 7


def _opset_too_new(d: Path) -> tuple[Path, str]:
    newer = opset_max() + 1  # one the installed onnxruntime does not run
    return _write(d / f"opset{newer}.onnx", _model(opset=newer)), f"opset {newer} is outside"


def _already_optimized(d: Path) -> tuple[Path, str]:
    fused = helper.make_node("Fused", ["x"], ["y"], name="evo0_deadbeef", domain="ai.evonnx", kernel="evo0_deadbeef")
    return _write(d / "optimized.onnx", _model(nodes=[fused], domain_opsets={"ai.evonnx": 1})), "already optimized"


def _not_a_file(d: Path) -> tuple[Path, str]:
    (d / "folder.onnx").mkdir()
    return d / "folder.onnx", "not a file"


def _negative_dim(d: Path) -> tuple[Path, str]:
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return _write(d / "negative.onnx", model), "declares dim 0 as -1"


def _external_data_outside(d: Path) -> tuple[Path, str]:
    model = _model()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../../etc/passwd"), ("offset", "0"), ("length", "24")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    return _write(d / "external.onnx", model), "must not leave the model's folder"


BAD_INPUTS = [_missing, _truncated, _random_bytes, _undefined_input, _opset_too_old, _opset_too_new, _already_optimized,
              _not_a_file, _negative_dim, _external_data_outside]


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=lambda f: f.__name__.strip("_"))
def test_cli_optimize_bad_input_fails_with_one_line_and_writes_nothing(bad: BadInput, tmp_path: Path) -> None:
    src_dir, out_dir = tmp_path / "src", tmp_path / "out"
    src_dir.mkdir()
    out_dir.mkdir()
    src, problem = bad(src_dir)
    before_src, before_out = _listing(src_dir), _listing(out_dir)
    result = CliRunner().invoke(main, ["optimize", str(src), "-o", str(out_dir / "model.opt.onnx")])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("evonnx: error: ") and problem in lines[0], lines[0]
    assert result.stdout == ""
    assert _listing(out_dir) == before_out == set()
    assert _listing(src_dir) == before_src


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=lambda f: f.__name__.strip("_"))
def test_cli_explain_bad_input_fails_with_one_line(bad: BadInput, tmp_path: Path) -> None:
    src, problem = bad(tmp_path)
    result = CliRunner().invoke(main, ["explain", str(src)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0], result.stderr


def test_cli_optimize_missing_output_folder_writes_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["optimize", str(SMALL_MODEL), "-o", str(tmp_path / "no" / "x.onnx")])
    assert result.exit_code == 1
    assert "output folder does not exist" in result.stderr
    assert _listing(tmp_path) == set()


@pytest.mark.parametrize("output", ["m.onnx", "m.evonnx.so"], ids=["model", "library"])
def test_cli_optimize_refuses_to_overwrite_its_input(output: str, tmp_path: Path) -> None:
    """`-o m.onnx` from m.onnx, and from m.evonnx.so (the library path of m.onnx)."""
    src = tmp_path / output
    src.write_bytes(SMALL_MODEL.read_bytes())
    result = CliRunner().invoke(main, ["optimize", str(src), "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 1 and "overwrite" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert src.read_bytes() == SMALL_MODEL.read_bytes() and _listing(tmp_path) == {output}


def test_cli_optimize_output_naming_a_folder_writes_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["optimize", str(SMALL_MODEL), "-o", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.startswith("evonnx: error: ") and "is a folder" in result.stderr
    assert _listing(tmp_path) == set() and not (tmp_path.parent / f"{tmp_path.name}.evonnx.so").exists()


def test_cli_optimize_report_into_missing_folder_writes_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["optimize", str(SMALL_MODEL), "-o", str(tmp_path / "x.onnx"),
                                       "--report", str(tmp_path / "no" / "r.json")])
    assert result.exit_code == 1 and "report folder does not exist" in result.stderr
    assert _listing(tmp_path) == set()


def test_cli_internal_error_is_one_line_and_writes_nothing(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import evonnx.api

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(evonnx.api, "run_pipeline", broken)
    result = CliRunner().invoke(main, ["optimize", str(SMALL_MODEL), "-o", str(tmp_path / "x.onnx")])
    assert result.exit_code == 70
    assert result.stderr.splitlines() == [
        "evonnx: internal error: RuntimeError: boom (a bug in evonnx; rerun with -vv for the traceback)"]
    assert _listing(tmp_path) == set()


@pytest.mark.parametrize("args", [["--dim", "B"], ["--dim", "B=two"], ["--input-shape", "x=1,a"]])
def test_cli_optimize_malformed_option_is_a_usage_error(args: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["optimize", str(SMALL_MODEL), "-o", str(tmp_path / "x.onnx"), *args])
    assert result.exit_code == 2
    assert args[0] in result.stderr
    assert _listing(tmp_path) == set()


@pytest.mark.compiler
def test_cli_optimize_subprocess_happy_path(tmp_path: Path) -> None:
    out = tmp_path / "anchors.opt.onnx"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "evonnx", "optimize", str(SMALL_MODEL), "-o", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    before = len(onnx.load(str(SMALL_MODEL)).graph.node)
    assert re.search(rf"\b{before} nodes -> 1 \(1 fused kernels\b", proc.stdout), proc.stdout
    assert "check: passed" in proc.stdout
    assert out.is_file() and (tmp_path / "anchors.opt.evonnx.so").is_file()
    assert _listing(tmp_path) == {"anchors.opt.onnx", "anchors.opt.evonnx.so"}  # no temp files left
    assert any(n.domain == "ai.evonnx" for n in onnx.load(str(out)).graph.node)


def test_cli_explain_leads_with_a_summary_and_gives_a_verdict_per_node_with_v() -> None:
    model = onnx.load(str(SMALL_MODEL))
    short = CliRunner().invoke(main, ["explain", str(SMALL_MODEL)])
    assert short.exit_code == 0, short.output
    head = short.stdout.splitlines()
    assert head[0].startswith(f"{SMALL_MODEL}: {len(model.graph.node)} nodes")
    assert re.match(r"1 fused kernels absorb \d+ nodes:$", head[1]), head
    assert re.match(r"  evo0_[0-9a-f]{8}: \d+ nodes \[", head[2]), head
    assert len(head) < 12 and not any(ln.startswith("kernel evo") for ln in head)  # no per-node noise

    result = CliRunner().invoke(main, ["explain", "-v", str(SMALL_MODEL)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:len(head)] == head
    for n in model.graph.node:
        verdicts = [ln for ln in lines if ln.strip().startswith(f"{n.name} ({n.op_type}): ")]
        assert len(verdicts) == 1, n.name
        assert re.search(r": (fused: evo\d+_[0-9a-f]{8}|left to onnxruntime: .+|inlined: .+|folded by onnxruntime)$",
                         verdicts[0]), verdicts[0]
    assert any(": fused: evo" in ln for ln in lines)
    assert any(ln.startswith("kernel evo") for ln in lines)

    as_json = CliRunner().invoke(main, ["explain", "--json", str(SMALL_MODEL)])
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.stdout)
    assert [n["name"] for n in doc["nodes"]] == [n.name for n in model.graph.node]
    assert len(doc["kernels"]) == 1 and sum(doc["kernels"][0]["ops"].values()) == \
        sum(n["verdict"] == "fused" for n in doc["nodes"])


def test_optimize_quiet_prints_nothing_and_verbose_logs_the_passes(tmp_path: Path) -> None:
    """-q: the model is written and nothing printed; -v: the passes' INFO lines. Neither is a terminal here, so
    no status line (`_StatusLine`) is drawn."""
    src = Path(__file__).resolve().parents[1] / "models" / "anchor_grid.onnx"
    quiet = CliRunner().invoke(main, ["optimize", str(src), "-o", str(tmp_path / "q.onnx"), "-q", "--no-guard"])
    assert quiet.exit_code == 0 and quiet.output == "", quiet.output
    assert (tmp_path / "q.onnx").is_file() and (tmp_path / "q.evonnx.so").is_file()
    loud = subprocess.run([sys.executable, "-m", "evonnx", "optimize", str(src), "-o", str(tmp_path / "v.onnx"), "-v",
                           "--no-guard"], capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0, loud.stderr
    assert "INFO evonnx.passes.pipeline: lower_groups: 1 kernels" in loud.stderr
    assert "\x1b[K" not in loud.stderr and "1 fused kernels" in loud.stdout


def test_optimize_shows_its_stage_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import evonnx.cli as cli

    monkeypatch.setattr(cli, "_on_terminal", lambda: True)
    src = Path(__file__).resolve().parents[1] / "models" / "anchor_grid.onnx"
    result = CliRunner().invoke(cli.main, ["optimize", str(src), "-o", str(tmp_path / "t.onnx"), "--no-guard"])
    assert result.exit_code == 0, result.output
    # click drops the erase-line escape where the stream is not a real terminal
    assert "\revonnx: planning..." in result.output and "\revonnx: checking against onnxruntime" in result.output
    assert cli._StatusLine.current is None
