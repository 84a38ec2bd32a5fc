"""The security fuzzer's CI budget: a fixed, seeded set of hypothesis-drawn graphs, each optimized and run next
to onnxruntime in child processes at sizes including 0 and 1 (see sec_oracle for what counts as a finding).

The budget is `EVONNX_FUZZ_EXAMPLES` cases (default 400, about two minutes on two cores) from seed
`EVONNX_FUZZ_SEED` (default 8). Every failing case is listed in the assertion message, and its model and summary
are kept under `EVONNX_FUZZ_FINDINGS` when that is set. The long run is `python tests/security/fuzz_long.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sec_fuzz import draw_cases, make_canary, report, run_cases

pytestmark = [pytest.mark.compiler, pytest.mark.slow]

EXAMPLES = int(os.environ.get("EVONNX_FUZZ_EXAMPLES", "400"))
SEED = int(os.environ.get("EVONNX_FUZZ_SEED", "8"))
JOBS = min(2, os.cpu_count() or 1)


def test_fuzz_optimized_graphs_behave_like_onnxruntime(tmp_path: Path) -> None:
    canary = make_canary(tmp_path)
    drawn = draw_cases(canary, EXAMPLES, SEED)
    findings = os.environ.get("EVONNX_FUZZ_FINDINGS")
    tally = run_cases(drawn, tmp_path / "cases", canary, jobs=JOBS,
                      findings_dir=Path(findings) if findings else None)
    print(tally.line())
    if tally.failing:
        pytest.fail(report(tally), pytrace=False)
    # The budget says something only if generated code ran: most cases must fuse, and canaries must reach kernels.
    assert tally.cases >= EXAMPLES // 2, tally.line()
    assert tally.fused >= tally.cases // 3, tally.line()
    assert tally.with_canaries >= tally.cases // 6, tally.line()
    assert tally.compared >= tally.cases, tally.line()
