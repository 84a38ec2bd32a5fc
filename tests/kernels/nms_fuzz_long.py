"""The NonMaxSuppression differential fuzz, long run (issue 14): test_nms.py's generator and oracle (onnxruntime's
NonMaxSuppression on the original model), for a given number of cases or time, over every box format and
optional-input form.

    .venv/bin/python tests/kernels/nms_fuzz_long.py --cases 100000 [--seconds 3600] [--seed 1] [--n-max 2000]
        [--findings nms-findings]

Each case that differs is saved as `<seed>_<k>.npz` (the feeds) in the findings folder, with a line in
`summary.txt`. Prints the count covered; exits 1 when anything differed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_nms import OPTIONAL, Pair, _case, _nms_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: no limit)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n-max", type=int, default=2000, help="the largest box count drawn")
    ap.add_argument("--findings", type=Path, default=Path("nms-findings"))
    args = ap.parse_args(argv)
    args.findings.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    done = failed = 0
    with tempfile.TemporaryDirectory(prefix="evonnx-nms-fuzz-") as tmp:
        pairs = {(cpb, given): Pair(_nms_model(Path(tmp) / f"nms_{cpb}_{given}.onnx", cpb, given))
                 for cpb in (0, 1) for given in (0, 1, 2, 3)}
        rng = np.random.default_rng(args.seed)
        while done < args.cases and not (args.seconds and time.monotonic() - start > args.seconds):
            cpb, given = int(rng.integers(0, 2)), int(rng.integers(0, 4))
            names = ["boxes", "scores", *(name for name, _ in OPTIONAL[:given])]
            feeds = {k: v for k, v in _case(rng, cpb, args.n_max).items() if k in names}
            if diff := pairs[(cpb, given)].compare(feeds):
                failed += 1
                np.savez(args.findings / f"{args.seed}_{done}.npz", **feeds)
                with (args.findings / "summary.txt").open("a") as f:
                    f.write(f"{args.seed}_{done} cpb={cpb} given={given}: {diff[:300]}\n")
            done += 1
            if done % 5000 == 0:
                print(f"[{time.monotonic() - start:6.0f} s] {done} cases, {failed} differ", flush=True)
    print(f"covered {done} cases in {time.monotonic() - start:.0f} s; {failed} differ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
