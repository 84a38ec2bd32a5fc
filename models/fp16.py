"""float16 versions of the manifest's models, made as users make them: onnxconverter-common's
`convert_float_to_float16` (inputs, outputs, initializers and every float tensor in float16; the ops it blocks stay
float32 behind Casts), written to `models/fp16/<file>`.

    python3 -m pip install --target /tmp/occ --no-deps onnxconverter-common==1.16.0
    PYTHONPATH=/tmp/occ .venv/bin/python models/fp16.py        # every manifest model

The converter's own shape inference types the result of a Cast to float as float16 without changing the Cast
(onnxruntime then refuses the model: "Type (tensor(float16)) of output arg ... does not match"), so such Casts
are made Casts to float16, and the original's value_info is dropped first. Each model is loaded and run once in
onnxruntime on the manifest's inputs, cast to float16, before it is written.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import onnx
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))


def convert(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxconverter_common import float16

    model = onnx.ModelProto.FromString(model.SerializeToString())
    del model.graph.value_info[:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converter warns about every value it clamps to float16's range
        half = float16.convert_float_to_float16(model, keep_io_types=False)
    typed = {v.name: v.type.tensor_type.elem_type for v in half.graph.value_info}
    for n in half.graph.node:
        if n.op_type == "Cast" and typed.get(n.output[0]) == onnx.TensorProto.FLOAT16:
            for a in n.attribute:
                if a.name == "to" and a.i == onnx.TensorProto.FLOAT:
                    a.i = onnx.TensorProto.FLOAT16
    onnx.checker.check_model(half)
    return half


def main() -> int:
    from inputs import half_feeds, largest_case, load_manifest, make_inputs

    out = HERE / "fp16"
    out.mkdir(exist_ok=True)
    manifest = load_manifest()
    failed = 0
    for name, entry in manifest.items():
        half = convert(onnx.load(HERE / entry["file"]))
        shapes = entry["checked_cases"][largest_case(entry)]
        so = ort.SessionOptions()
        so.log_severity_level = 4
        try:
            sess = ort.InferenceSession(half.SerializeToString(), so, providers=["CPUExecutionProvider"])
            sess.run(None, half_feeds(make_inputs(entry, shapes)))
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several types; the model is skipped
            print(f"{name}: onnxruntime cannot run the float16 version: {str(e)[:200]}", file=sys.stderr)
            failed += 1
            continue
        onnx.save(half, out / entry["file"])
        print(f"{name}: {len(half.graph.node)} nodes")
    (out / "README.md").write_text(
        "float16 versions of the models in `models/`, written by `models/fp16.py` (onnxconverter-common's\n"
        "float16 conversion); the manifest's entries and input recipes apply, with float inputs in float16.\n")
    print(json.dumps({"written": len(manifest) - failed, "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
