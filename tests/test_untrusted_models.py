"""Regression tests for hostile models (issue 8): text from a model never becomes code, a library serves only the
model it was built for, and optimize time does not explode on deep expression DAGs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from evonnx.api import library_path, optimize

pytestmark = pytest.mark.compiler


def _canary(marker: Path) -> str:
    """C that, if it were ever compiled as code, creates `marker` when the library is loaded."""
    return (f'int evil_{marker.stem}(void); __attribute__((constructor)) static void pwn(void) '
            f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}')


def _hostile_model(marker: Path) -> onnx.ModelProto:
    code = _canary(marker)
    out = f"y */ {code} /*"  # ends the tensor comment of a task function
    spliced = f"n *\\\n/ {code} /*"  # backslash-newline: the compiler splices `*` and `/` back together
    trigraph = f'q ??/" {code} /* %n %s'  # ??/ is a backslash under trigraphs; % is a format directive
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Neg", ["x"], [trigraph], name=spliced),
             helper.make_node("Mul", [trigraph, "c"], ["t\u00e9\u2028" + "*/" * 40], name=trigraph),
             helper.make_node("Exp", ["t\u00e9\u2028" + "*/" * 40], [out], name=out + " node")]
    graph = helper.make_graph(nodes, f"g */ {code} /*", [x], [y],
                              initializer=[numpy_helper.from_array(np.array([2.0], np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_names_never_reach_the_source_as_code(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    src = tmp_path / "m.onnx"
    onnx.save(_hostile_model(marker), src)
    dump = tmp_path / "dump"
    result = optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump)
    assert result.kernels, "the hostile graph must go through code generation"
    source = (dump / "kernels.c").read_text()
    assert "*/ int evil" not in source and "??" not in source and "\\\n/" not in source
    assert "__attribute__((constructor))" in source  # present, but only inside an encoded comment
    # a fresh process loads the library and runs the model: the constructor must never run
    run = (f"import numpy as np, evonnx; s = evonnx.load_session({str(tmp_path / 'm.opt.onnx')!r}); "
           "print(s.run(None, {'x': np.ones((3, 4), np.float32)})[0].sum())")
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "code from a model name ran"


def _arith_model(scale: float) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Mul", ["x", "c"], ["t"], name="mul"),
             helper.make_node("Add", ["t", "c"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [x], [y],
                              initializer=[numpy_helper.from_array(np.array([scale], np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_library_serves_only_its_own_model(tmp_path: Path) -> None:
    # same node names, so the same kernel names; different arithmetic
    for name, scale in (("a", 2.0), ("b", 3.0)):
        onnx.save(_arith_model(scale), tmp_path / f"{name}.onnx")
        optimize(tmp_path / f"{name}.onnx", tmp_path / f"{name}.opt.onnx")
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library_path(tmp_path / "b.opt.onnx")))
    with pytest.raises(Exception, match="the model and the library do not belong together"):
        ort.InferenceSession(str(tmp_path / "a.opt.onnx"), so, providers=["CPUExecutionProvider"])


def _doubling_chain(levels: int) -> onnx.ModelProto:
    """a = a*a + a, `levels` times: 2*levels nodes, 3^levels paths through the expression."""
    nodes, a = [], "x"
    for k in range(levels):
        nodes += [helper.make_node("Mul", [a, a], [f"m{k}"], name=f"mul{k}"),
                  helper.make_node("Add", [f"m{k}", a], [f"a{k}"], name=f"add{k}")]
        a = f"a{k}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info(a, TensorProto.FLOAT, ["N", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_deep_shared_expressions_plan_in_linear_time(tmp_path: Path) -> None:
    # 24 levels are 2.8e11 paths: any walk that is not memoised never finishes; memoised, this takes seconds
    onnx.save(_doubling_chain(24), tmp_path / "chain.onnx")
    script = (f"from evonnx.api import optimize; "
              f"r = optimize({str(tmp_path / 'chain.onnx')!r}, {str(tmp_path / 'chain.opt.onnx')!r}, check=False); "
              f"print(len(r.kernels))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) >= 1
