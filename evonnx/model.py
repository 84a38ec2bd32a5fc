"""Loading and checking input models: every failure is an `InvalidModelError` naming the file and the problem."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from evonnx.errors import InvalidModelError

log = logging.getLogger(__name__)

OPSET_MIN, OPSET_MAX = 13, 21
DOMAIN = "ai.evonnx"


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise InvalidModelError("the model imports no version of the default ONNX domain")


def load_model(path: str | Path) -> onnx.ModelProto:
    """Read, check and shape-infer a model; nodes get unique names so plans and messages can refer to them."""
    p = Path(path)
    if not p.exists():
        raise InvalidModelError(f"{p}: no such file")
    if not p.is_file():
        raise InvalidModelError(f"{p}: not a file")
    try:
        model = onnx.load(str(p))
    except (DecodeError, ValueError, OSError, RuntimeError) as e:
        raise InvalidModelError(f"{p}: not a readable ONNX model ({type(e).__name__}: {_first_line(e)})") from e
    if not model.graph.node and not model.graph.output:
        raise InvalidModelError(f"{p}: not a readable ONNX model (empty or truncated file)")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise InvalidModelError(f"{p}: fails the ONNX checker: {_first_line(e)}") from e
    opset = default_opset(model)
    if not OPSET_MIN <= opset <= OPSET_MAX:
        raise InvalidModelError(f"{p}: opset {opset} is outside the supported range {OPSET_MIN} to {OPSET_MAX} "
                                f"(convert it with onnx.version_converter)")
    for n in model.graph.node:
        if n.domain == DOMAIN:
            raise InvalidModelError(f"{p}: already optimized by evonnx (node '{n.name}' is in domain {DOMAIN}); "
                                    f"optimize the original model")
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except onnx.shape_inference.InferenceError as e:
        raise InvalidModelError(f"{p}: ONNX shape inference fails: {_first_line(e)}") from e
    _name_nodes(model)
    return model


def _name_nodes(model: onnx.ModelProto) -> None:
    seen: set[str] = set()
    for k, n in enumerate(model.graph.node):
        name = n.name or f"{n.op_type}_{k}"
        while name in seen:
            name = f"{name}_{k}"
        seen.add(name)
        n.name = name


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
