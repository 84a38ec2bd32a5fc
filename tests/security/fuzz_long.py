"""The security fuzzer's long run: the CI test's generator and oracle, for a given number of graphs or time.

    .venv/bin/python tests/security/fuzz_long.py --graphs 100000 --jobs 2 [--seconds 3600] [--seed 1000]
        [--findings fuzz-findings] [--names adversarial|plain|mixed]

Graphs are drawn in chunks of `--chunk` from seeds `--seed`, `--seed + 1`, ... (so a run can be resumed or
split across machines by seed). Every failing case is kept in the findings folder as `<key>.onnx` (the original
model) and `<key>.txt` (the case and its findings), with a one-line summary appended to `summary.txt`. A case where
evonnx's check left a kernel that differed to onnxruntime (`evonnx.blame`) is no failure, but is kept the same way
under `blamed/`. Prints the count covered at the end; exits 1 when anything was found.

A run resumes: the findings folder keeps `progress.json` (the digest of the code under test, the next seed, the
counts so far), and a later run on the same folder continues from there, so that a long run can span several
sittings. The digest covers evonnx/, passes/, kernels/ and this fuzzer; a folder whose run was for other code is
refused (start a new folder: counts from different code do not add up).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("EVONNX_COST_MODEL", "defaults")
os.environ.setdefault("EVONNX_GUARD", "0")

from sec_fuzz import Tally, draw_cases, make_canary, run_cases  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_COUNTS = ("cases", "fused", "refused", "with_canaries", "compared", "blamed")


def code_digest() -> str:
    """sha256 of the product's code and the fuzzer's: what a count of graphs is a count for."""
    h = hashlib.sha256()
    for folder in ("evonnx", "passes", "kernels", "tests/security"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".c", ".h", ".cu", ".cc", ".sh"):
                h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def load_progress(path: Path, digest: str) -> dict | None:
    if not path.exists():
        return None
    progress = json.loads(path.read_text())
    if progress["code"] != digest:
        sys.exit(f"fuzz_long: error: {path} is a run for other code ({progress['code']}, this is {digest}); "
                 f"name a new --findings folder")
    return progress


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
    digest = code_digest()
    progress_path = args.findings / "progress.json"
    earlier = 0.0  # seconds spent by earlier sittings
    progress = load_progress(progress_path, digest)
    if progress is not None:
        seed, index, earlier = progress["next_seed"], progress["next_index"], progress["seconds"]
        for f in _COUNTS:
            setattr(total, f, progress["counts"].get(f, 0))
        total.refusals = progress["refusals"]
        failing = progress["failing"]
        print(f"resuming at seed {seed}: {total.cases} graphs covered in {earlier:.0f} s, {failing} failing "
              f"(code {digest})", flush=True)
    else:
        failing = 0

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
        for field in _COUNTS:
            setattr(total, field, getattr(total, field) + getattr(tally, field))
        total.failing += tally.failing
        for r, n in tally.refusals.items():
            total.refusals[r] = total.refusals.get(r, 0) + n
        seed += 1
        progress_path.write_text(json.dumps({
            "code": digest, "next_seed": seed, "next_index": index, "seconds": earlier + time.monotonic() - start,
            "counts": {f: getattr(total, f) for f in _COUNTS}, "refusals": total.refusals,
            "failing": failing + len(total.failing)}, indent=1))
        print(f"[{earlier + time.monotonic() - start:7.0f} s] seed {seed - 1}: {total.line()}"
              + (f" (and {failing} in earlier sittings)" if failing else ""), flush=True)
    failing += len(total.failing)
    print(f"covered {total.cases} graphs in {earlier + time.monotonic() - start:.0f} s (code {digest}); "
          f"{failing} failing, kept in {args.findings}/ (summary.txt)")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
