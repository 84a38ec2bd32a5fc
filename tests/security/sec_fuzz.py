"""The fuzz driver shared by the CI test (`test_fuzz.py`) and the long run (`fuzz_long.py`).

`draw_cases` draws cases with hypothesis (seeded, no database, generation only: a finding is reported with its
model rather than shrunk, and a whole budget runs even when early cases fail). `run_cases` checks them with
`sec_oracle.check_case`, a few at a time. Every case gets its own canary marker file: the marker's path in the
drawn model ends in a fixed-width slot that `retarget` rewrites to the case's number (same length, so the
serialized protobuf stays valid).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import re
import secrets
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx
from hypothesis import HealthCheck, Phase, given, seed, settings
from sec_cases import Case
from sec_graphs import cases
from sec_oracle import Outcome, check_case, save_finding
from sec_payloads import Canary

SLOT = "SLOT00000000"


def make_canary(root: Path) -> Canary:
    (root / "markers").mkdir(parents=True, exist_ok=True)
    return Canary(marker=str(root / "markers" / SLOT), tag=secrets.token_hex(3))


def case_marker(canary: Canary, index: int) -> Path:
    return Path(canary.marker.replace(SLOT, f"SLOT{index:08d}"))


def retarget(case: Case, canary: Canary, index: int) -> Case:
    """`case` with its payloads creating `case_marker(canary, index)` instead of the shared slot."""
    new = str(case_marker(canary, index))
    assert len(new) == len(canary.marker)
    data = case.model.SerializeToString().replace(canary.marker.encode(), new.encode())
    return replace(case, model=onnx.load_from_string(data), file_name=case.file_name.replace(canary.marker, new))


def case_key(case: Case) -> str:
    h = hashlib.sha256(case.model.SerializeToString())
    h.update(repr((case.plans, case.value_regime, case.seed, case.file_name)).encode())
    return h.hexdigest()[:16]


def draw_cases(canary: Canary, count: int, seed_value: int, adversarial: bool | None = None) -> list[Case]:
    """`count` distinct cases drawn with hypothesis from `seed_value` (deterministic for a given code)."""
    drawn: list[Case] = []

    @seed(seed_value)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(cases(canary, adversarial=adversarial))
    def collect(case: Case) -> None:
        drawn.append(case)

    collect()
    seen: set[str] = set()
    out = []
    for c in drawn:
        k = case_key(c)
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


@dataclass
class Tally:
    cases: int = 0
    fused: int = 0  # cases whose optimized model has a Fused node
    refused: int = 0
    with_canaries: int = 0  # fused cases whose model text carries canaries
    compared: int = 0  # runs compared
    blamed: int = 0  # cases where the check left a kernel that differed to onnxruntime (Outcome.blamed)
    failing: list[tuple[Case, Outcome, str]] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)  # clean refusals by the start of their message

    def add(self, case: Case, outcome: Outcome, key: str) -> None:
        self.cases += 1
        self.fused += outcome.fused > 0
        self.refused += outcome.status == "refused"
        if outcome.status == "refused":
            reason = re.sub(r"\s+", " ", re.sub(r"'[^']*'|/\S+|\d+", "_", outcome.note))[:90]
            self.refusals[reason] = self.refusals.get(reason, 0) + 1
        self.with_canaries += outcome.fused > 0 and bool(case.canaries)
        self.compared += outcome.runs_compared
        self.blamed += bool(outcome.blamed)
        if outcome.findings:
            self.failing.append((case, outcome, key))

    def line(self) -> str:
        return (f"{self.cases} cases: {self.fused} with fused kernels ({self.with_canaries} of them with canaries "
                f"in their names), {self.refused} refused cleanly, {self.compared} runs compared, "
                f"{self.blamed} with a kernel the check left to onnxruntime, {len(self.failing)} failing")


def run_cases(items: Iterable[Case], root: Path, canary: Canary, *, jobs: int = 2, start: int = 0,
              on_result: Callable[[Case, Outcome, str], None] | None = None,
              findings_dir: Path | None = None) -> Tally:
    tally = Tally()

    def one(index: int, case: Case) -> tuple[Case, Outcome, str]:
        case = retarget(case, canary, index)
        key = f"case{index:06d}-{case_key(case)[:8]}"
        # every other case with the greedy planner, which fuses whatever it can: the cost model leaves some ops to
        # onnxruntime in small graphs, and their code would never be tried
        planner = "greedy" if index % 2 else "search"
        outcome = check_case(case, root / key, case_marker(canary, index), env_extra={"EVONNX_SEC_PLANNER": planner})
        if outcome.findings and findings_dir is not None:
            save_finding(case, outcome, findings_dir, key, planner)
        elif outcome.blamed and findings_dir is not None:  # not failing, but a kernel differed: kept to look at
            save_finding(case, outcome, findings_dir / "blamed", key, planner)
        if not outcome.findings:
            shutil.rmtree(root / key, ignore_errors=True)  # keep only what a person may want to look at
        return case, outcome, key

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, start + i, c) for i, c in enumerate(items)]
        for fut in futures:
            case, outcome, key = fut.result()
            tally.add(case, outcome, key)
            if on_result is not None:
                on_result(case, outcome, key)
    return tally


def report(tally: Tally, limit: int = 40) -> str:
    lines = [tally.line()]
    lines += [f"  refused {n}x: {r}" for r, n in sorted(tally.refusals.items(), key=lambda kv: -kv[1])[:8]]
    for case, outcome, key in tally.failing[:limit]:
        lines.append(f"- {key}: {case.describe()[:400]}")
        lines += [f"    {f[:300]}" for f in outcome.findings[:6]]
    if len(tally.failing) > limit:
        lines.append(f"... and {len(tally.failing) - limit} more failing cases")
    return "\n".join(lines)
