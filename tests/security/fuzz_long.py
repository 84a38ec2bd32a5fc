"""The security fuzzer's long run: the CI test's generator and oracle, for a given number of graphs or time.

    .venv/bin/python tests/security/fuzz_long.py --graphs 100000 --jobs 2 [--seconds 3600] [--seed 1000]
        [--findings fuzz-findings] [--names adversarial|plain|mixed]

Graphs are drawn in chunks of `--chunk` from seeds `--seed`, `--seed + 1`, ... (so a run can be resumed or
split across machines by seed). Every failing case is kept in the findings folder as `<key>.onnx` (the original
model) and `<key>.txt` (the case and its findings), with a one-line summary appended to `summary.txt`. Prints
the count covered at the end; exits 1 when anything was found.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("EVONNX_COST_MODEL", "defaults")
os.environ.setdefault("EVONNX_GUARD", "0")

from sec_fuzz import Tally, draw_cases, make_canary, run_cases  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=1000, help="graphs to check (default 1000)")
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: no limit)")
    ap.add_argument("--jobs", type=int, default=2, help="cases checked at once (default 2)")
    ap.add_argument("--seed", type=int, default=1000, help="first seed (default 1000)")
    ap.add_argument("--chunk", type=int, default=50, help="graphs drawn per seed (default 50)")
    ap.add_argument("--findings", type=Path, default=Path("fuzz-findings"), help="folder for failing cases")
    ap.add_argument("--names", choices=("mixed", "adversarial", "plain"), default="mixed")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = ap.parse_args(argv)

    adversarial = {"mixed": None, "adversarial": True, "plain": False}[args.names]
    work = args.work or Path(tempfile.mkdtemp(prefix="evonnx-fuzz-"))
    args.findings.mkdir(parents=True, exist_ok=True)
    summary = args.findings / "summary.txt"
    canary = make_canary(work)
    total = Tally()
    start = time.monotonic()
    seed = args.seed
    index = 0

    def record(case, outcome, key) -> None:  # noqa: ANN001
        with summary.open("a") as f:
            f.write(f"{key} seed {seed}: {outcome.findings[0][:300]!r} ({len(outcome.findings)} findings); "
                    f"{case.describe()[:300]!r}\n")

    while total.cases < args.graphs and not (args.seconds and time.monotonic() - start > args.seconds):
        want = min(args.chunk, args.graphs - total.cases)
        drawn = draw_cases(canary, want, seed, adversarial=adversarial)
        tally = run_cases(drawn, work / f"seed{seed}", canary, jobs=args.jobs, start=index,
                          findings_dir=args.findings,
                          on_result=lambda c, o, k: record(c, o, k) if o.findings else None)
        index += len(drawn)
        for field in ("cases", "fused", "refused", "with_canaries", "compared"):
            setattr(total, field, getattr(total, field) + getattr(tally, field))
        total.failing += tally.failing
        for r, n in tally.refusals.items():
            total.refusals[r] = total.refusals.get(r, 0) + n
        print(f"[{time.monotonic() - start:7.0f} s] seed {seed}: {total.line()}", flush=True)
        seed += 1
    print(f"covered {total.cases} graphs in {time.monotonic() - start:.0f} s; {len(total.failing)} failing, "
          f"kept in {args.findings}/ (summary.txt)")
    return 1 if total.failing else 0


if __name__ == "__main__":
    sys.exit(main())
