"""Post-export quantization for the whole-model corpus (models/corpus.py): what users of a float export commonly run
next for CPU serving, onnxruntime's own static quantizer in QDQ form (QuantizeLinear/DequantizeLinear pairs around
every quantized op, which onnxruntime's QDQ fusions turn into int8 kernels at session start).

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
