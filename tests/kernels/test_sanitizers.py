"""The generated kernels under AddressSanitizer and UndefinedBehaviorSanitizer.

For every model in models/ and for a handful of the security fuzzer's graphs, the kernels evonnx generates (and
its custom-op runtime) are built with `-fsanitize=address,undefined -fno-sanitize-recover=undefined
-fno-omit-frame-pointer` and run in a child process, next to plain onnxruntime on the original model, at sizes
that include 0 and 1 for every symbolic dim. onnxruntime's CPU arena is off and inputs live in exact-size
malloc'd buffers, so that a read or write past a tensor lands in a red zone. Any sanitizer report, crash or hang
fails; so does, for the shipped models, any difference from onnxruntime (outputs, or error vs result).

Skipped, saying so, only where the compiler's sanitizer runtime (libasan, libubsan) is missing.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

HERE = Path(__file__).resolve().parent
for folder in (HERE.parent, HERE.parent / "security"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from model_inputs import ENTRIES, MODELS_DIR, make_inputs  # noqa: E402
from sec_cases import case_from_model  # noqa: E402
from sec_fuzz import draw_cases, make_canary  # noqa: E402
from sec_models import REGRESSIONS, SANITIZER_SUBSET  # noqa: E402
from sec_oracle import (  # noqa: E402
    Outcome,
    case_feeds,
    child_env,
    exactness,
    judge_runs,
    optimize_case,
    run_models,
)
from sec_sanitize import SANITIZE, SanitizedBuilder, sanitizer_env, sanitizer_runtime_missing  # noqa: E402

from evonnx.toolchain import cpu_runs_v3  # noqa: E402

pytestmark = pytest.mark.compiler

FUZZ_GRAPHS = int(os.environ.get("EVONNX_SANITIZER_FUZZ_GRAPHS", "10"))
JOBS = min(2, os.cpu_count() or 1)


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> SanitizedBuilder:
    missing = sanitizer_runtime_missing()
    if missing:
        pytest.skip(missing)
    return SanitizedBuilder(tmp_path_factory.mktemp("sanitized-runtime"))


def _symbolic_variants(entry: dict[str, Any], case: dict[str, list[int]]) -> list[tuple[str, dict[str, list[int]]]]:
    """`case` with every symbolic dim of the manifest's input shapes set to 0, then to 1."""
    out = []
    for size in (0, 1):
        shapes = {}
        for inp in entry["inputs"]:
            shapes[inp["name"]] = [size if isinstance(d, str) else n for d, n in zip(inp["shape"], case[inp["name"]])]
        if shapes != case:
            out.append((f"symbolic dims = {size}", shapes))
    return out


def _model_feeds(entry: dict[str, Any]) -> list[tuple[str, dict]]:
    cases = sorted(entry["checked_cases"], key=lambda c: sum(_prod(s) for s in c.values()))[:2]
    labelled = [(f"checked case {k}", c) for k, c in enumerate(cases)] + _symbolic_variants(entry, cases[0])
    return [(label, make_inputs(entry, case, seed=k)) for k, (label, case) in enumerate(labelled)]


def _prod(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _sanitized_run(work: Path, original: Path, feeds: list[tuple[str, dict]], builder: SanitizedBuilder,
                   exact: bool, shapes: dict | None = None) -> Outcome:
    work.mkdir(parents=True, exist_ok=True)
    outcome = Outcome()
    dst = work / "out" / "model.opt.onnx"
    dst.parent.mkdir(parents=True, exist_ok=True)
    res = optimize_case(original, dst, work / "dump", work, child_env(), outcome, shapes=shapes)
    if res is None or res["status"] != "ok":
        return outcome
    lib = builder.library(work / "dump" / "kernels.c", work / "model.opt.asan.so")
    # both variants of the CPU kernels, as the check runs them: a serving machine without AVX2 runs the baseline one
    for variant in ("", "baseline") if cpu_runs_v3() else ("",):
        env = child_env({**sanitizer_env(), **({"EVONNX_CPU_ISA": variant} if variant else {})})
        (work / (variant or "picked")).mkdir(exist_ok=True)
        runs, rc, err, started = run_models(feeds, original, dst, lib, work / (variant or "picked"), env,
                                            arena=False, malloc_inputs=True)
        judge_runs(exactness(onnx.load(str(original)), exact), runs, rc, err, started, outcome,
                   what=f"[asan+ubsan{', ' + variant if variant else ''}] ")
    return outcome


def test_sanitizers_probe_catches_an_overflow(builder: SanitizedBuilder, tmp_path: Path) -> None:
    """The setup is not vacuous: a library that reads one byte past a malloc'd buffer, loaded by a Python child
    with the environment the tests use, is reported by ASan."""
    probe = tmp_path / "probe.c"
    probe.write_text(
        "#include <stdlib.h>\n#include <string.h>\n"
        "int evo_probe(void) { char *p = malloc(8); memset(p, 0, 8); volatile char c = p[8]; free(p); return c; }\n"
        "__attribute__((constructor)) static void run_probe(void) { evo_probe(); }\n")
    lib = tmp_path / "probe.so"
    subprocess.run([os.environ.get("CC", "gcc"), "-shared", "-fPIC", *SANITIZE, str(probe), "-o", str(lib)],
                   check=True)
    r = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(lib)!r})"], capture_output=True,
                       text=True, env=child_env(sanitizer_env()))
    assert r.returncode != 0 and "heap-buffer-overflow" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_sanitizers_on_every_shipped_model(builder: SanitizedBuilder, tmp_path: Path) -> None:
    def one(name: str) -> tuple[str, Outcome]:
        entry = ENTRIES[name]
        smallest = sorted(entry["checked_cases"], key=lambda c: sum(_prod(s) for s in c.values()))[0]
        return name, _sanitized_run(tmp_path / name, MODELS_DIR / entry["file"], _model_feeds(entry), builder,
                                    exact=False, shapes=smallest)

    with concurrent.futures.ThreadPoolExecutor(JOBS) as pool:
        results = list(pool.map(one, sorted(ENTRIES)))
    problems = [f"{name}: {f}" for name, o in results for f in o.findings]
    not_built = [f"{name}: {o.status} {o.note}" for name, o in results if o.status != "ok"]
    if problems or not_built:
        pytest.fail("\n".join(problems + [f"not optimized: {n}" for n in not_built]), pytrace=False)


@pytest.mark.slow
def test_sanitizers_on_fuzzer_graphs(builder: SanitizedBuilder, tmp_path: Path) -> None:
    """Plain-named fuzzer graphs (the security fuzzer checks names and results): no sanitizer report, no crash."""
    canary = make_canary(tmp_path)
    drawn = draw_cases(canary, FUZZ_GRAPHS * 2, seed_value=11, adversarial=False)

    def one(item: tuple[int, Any]) -> tuple[Any, Outcome]:
        k, case = item
        work = tmp_path / f"graph{k}"
        work.mkdir(parents=True, exist_ok=True)
        src = work / "original.onnx"
        onnx.save(case.model, str(src))
        return case, _sanitized_run(work, src, case_feeds(case), builder, exact=case.exact)

    with concurrent.futures.ThreadPoolExecutor(JOBS) as pool:
        results = list(pool.map(one, enumerate(drawn)))
    built = [(c, o) for c, o in results if o.status == "ok" and o.fused > 0][:FUZZ_GRAPHS]
    problems = [f"{c.describe()[:300]}\n    {f}" for c, o in results for f in o.crashes]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    assert len(built) >= min(FUZZ_GRAPHS, len(drawn)) // 2, f"only {len(built)} fuzzer graphs built kernels"


def test_sanitizers_on_bug_class_models(builder: SanitizedBuilder, tmp_path: Path) -> None:
    """One model per bug class of the security issue (sec_models), at its sizes: no sanitizer report, no crash
    (whether the results match onnxruntime is test_bug_classes' business)."""
    def one(key: str) -> tuple[str, Outcome]:
        reg = REGRESSIONS[key]()
        work = tmp_path / key.replace("/", "_").replace(" ", "")
        work.mkdir(parents=True, exist_ok=True)
        src = work / "original.onnx"
        onnx.save(reg.model, str(src))
        return key, _sanitized_run(work, src, case_feeds(case_from_model(reg.model, reg.plans)), builder, exact=True)

    with concurrent.futures.ThreadPoolExecutor(JOBS) as pool:
        results = list(pool.map(one, SANITIZER_SUBSET))
    problems = [f"{key} ({REGRESSIONS[key]().note}): {f}" for key, o in results for f in o.crashes]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def test_sanitizers_on_nms(builder: SanitizedBuilder, tmp_path: Path) -> None:
    """evonnx's NonMaxSuppression op (issue 14) under the sanitizers, on test_nms's generator: sizes 0 and 1,
    NaN, infinite, zero-area and inverted boxes, both box formats, with and without the optional inputs. No
    report, no crash, and the same rows as onnxruntime (or the same failure)."""
    from test_nms import OPTIONAL, _case, _nms_model

    problems = []
    for cpb in (0, 1):
        for given in (0, 3):
            src = _nms_model(tmp_path / f"nms_{cpb}_{given}.onnx", cpb, given)
            rng = np.random.default_rng(10 * cpb + given)
            names = {"boxes", "scores", *(name for name, _ in OPTIONAL[:given])}
            feeds = [(f"case {k}", {n: v for n, v in _case(rng, cpb, 300).items() if n in names}) for k in range(30)]
            outcome = _sanitized_run(tmp_path / f"run_{cpb}_{given}", src, feeds, builder, exact=True)
            problems += [f"cpb={cpb} given={given}: {f}" for f in outcome.findings]
            if outcome.status != "ok":
                problems.append(f"cpb={cpb} given={given}: not optimized: {outcome.status} {outcome.note}")
    assert not problems, "\n".join(problems)
