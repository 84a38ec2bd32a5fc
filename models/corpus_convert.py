"""Post-export conversions for the whole-model corpus (models/corpus.py), what users of a float export commonly run
next:
- "qdq": onnxruntime's own static quantizer in QDQ form (QuantizeLinear/DequantizeLinear pairs around every
  quantized op, which onnxruntime's QDQ fusions turn into int8 kernels at session start), for CPU serving;
- "fp16": onnxconverter-common's `convert_float_to_float16` (models/fp16.py: inputs, outputs, initializers and every
  float tensor in float16; onnxruntime's CPU EP puts Casts to float around the ops it has no float16 kernel for).

The calibration images are deterministic (numpy's generator seeded per image), so a rerun gives the same scales and
the same bytes. Random weights make the scales meaningless for accuracy; they still give the graph users have.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

CALIBRATION_IMAGES = 4


def _images(name: str, shape: tuple[int, ...], seed: int) -> Any:
    """An onnxruntime.quantization CalibrationDataReader over seeded random images."""
    from onnxruntime.quantization import CalibrationDataReader

    class Images(CalibrationDataReader):
        def __init__(self) -> None:
            self.k = 0

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self.k >= CALIBRATION_IMAGES:
                return None
            self.k += 1
            return {name: np.random.default_rng(seed + self.k).random(shape, dtype=np.float32)}

    return Images()


def quantize_qdq(model: Path, stage: Path, input_name: str, shape: tuple[int, ...], seed: int) -> dict[str, Any]:
    """Quantizes `model` in place (QDQ, uint8 activations, int8 weights per channel); returns its manifest note."""
    from onnxruntime import __version__ as ort_version
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre, out = stage / "preprocessed.onnx", stage / "quantized.onnx"
    quant_pre_process(str(model), str(pre), skip_symbolic_shape=True)
    quantize_static(str(pre), str(out), _images(input_name, shape, seed), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
    shutil.move(out, model)
    return {"quantizer": f"onnxruntime.quantization {ort_version}",
            "quantize_call": "quant_pre_process(skip_symbolic_shape=True); quantize_static(quant_format=QDQ, "
                             "activation_type=QUInt8, weight_type=QInt8, per_channel=True)",
            "calibration": f"{CALIBRATION_IMAGES} images numpy.random.default_rng({seed} + k).random({list(shape)}, "
                           f"float32), k = 1..{CALIBRATION_IMAGES}"}


def to_float16(model: Path) -> dict[str, Any]:
    """Converts `model` to float16 in place (models/fp16.convert); returns its manifest note."""
    import warnings

    import onnx
    from fp16 import convert
    from onnxconverter_common import __version__ as occ_version

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converter warns about values out of float16's range
        half = convert(onnx.load(str(model)))
    onnx.save(half, str(model))
    return {"converter": f"onnxconverter-common {occ_version}",
            "convert_call": "models/fp16.convert: float16.convert_float_to_float16(model, keep_io_types=False), then "
                            "its Casts typed float16 made Casts to float16"}


def convert(kind: str, model: Path, stage: Path, input_name: str, shape: tuple[int, ...], seed: int
            ) -> dict[str, Any]:
    """Applies the conversion `kind` ("qdq" or "fp16") to `model` in place."""
    if kind == "qdq":
        return quantize_qdq(model, stage, input_name, shape, seed)
    if kind == "fp16":
        return to_float16(model)
    raise ValueError(f"unknown conversion {kind!r}")
