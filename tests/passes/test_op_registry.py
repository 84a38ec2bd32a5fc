"""The op registry (issue 13): one OpDef per op, and every table the passes ask is a view of it."""

from __future__ import annotations

import pytest

from evonnx import expr as E
from evonnx.passes import lower_ops as R
from evonnx.passes.lazy import Reject, known
from evonnx.passes.lower_common import MapKind


def test_every_table_is_a_view_of_the_registry() -> None:
    assert set(R.LOWER) == set(R.OPS)
    assert R.REDUCTIONS == {op for op, d in R.OPS.items() if d.kind is MapKind.REDUCTION}
    assert R.FREE_OPS <= {op for op, d in R.OPS.items() if d.kind is MapKind.REORGANIZE}
    assert R.WRITE_OPS == {"ScatterND", "ScatterElements"}
    assert R.SHAPE_ONLY_OPS == {"Shape", "Size"}
    for op, slots in R.VALUE_INPUTS.items():
        assert slots == R.OPS[op].value_inputs and slots


def test_two_definitions_of_one_op_are_refused() -> None:
    d = R.OPS["Relu"]
    with pytest.raises(AssertionError, match="two OpDefs for Relu"):
        R._registry([d], [d])


@pytest.mark.parametrize("op", ["HardSwish", "Sqrt", "Exp"])
def test_an_input_type_outside_the_definition_is_left_with_its_reason(op: str) -> None:
    x = known((E.const(4, "int32"),), (), "int32")
    with pytest.raises(Reject, match=f"{op} on int32 is not supported"):
        R.lower_node(op, {}, [x], [None], 1)


def test_a_lowering_that_fails_other_than_by_reject_is_an_internal_error_in_debug_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from evonnx.errors import InternalError
    from evonnx.passes.lower_common import OpDef

    def broken(op: str, attrs: dict, args: list, vals: list, n_out: int) -> list:
        raise KeyError("a bug")

    monkeypatch.setitem(R.OPS, "Relu", OpDef("Relu", broken, MapKind.ONE_TO_ONE))
    x = known((E.const(1.0, "float32"),), (), "float32")
    monkeypatch.setenv("EVONNX_DEBUG", "1")
    with pytest.raises(InternalError, match="the lowering of Relu raised KeyError"):
        R.lower_node("Relu", {}, [x], [None], 1)
    monkeypatch.setenv("EVONNX_DEBUG", "0")
    with pytest.raises(Reject, match="Relu: 'a bug'"):
        R.lower_node("Relu", {}, [x], [None], 1)
