"""SLO gate, latency summary, response validation and corpus (plain functions, no Locust)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tritonforge.loadtest import corpus
from tritonforge.loadtest.bench.aggregation import CAUSE, aggregate, analyse
from tritonforge.loadtest.bench.cells import EMPTY_SUMMARY, Cell, Target
from tritonforge.loadtest.bench.report import chart, table
from tritonforge.loadtest.bench.text_causes import one_client_cause, server_split, throughput_cause
from tritonforge.loadtest.slo import (
    SloThresholds,
    ValidationError,
    check_slos,
    summarize,
    validate,
    validate_classification,
)

LIMITS = SloThresholds(p95_ms=100, p99_ms=200, min_rps=10, max_fail_ratio=0.01)


def test_all_thresholds_met_gives_no_breach() -> None:
    assert check_slos(LIMITS, requests=500, p95_ms=99, p99_ms=199, rps=10, fail_ratio=0.01) == []


def test_every_breached_threshold_is_named_with_its_numbers() -> None:
    breaches = check_slos(LIMITS, requests=50, p95_ms=150, p99_ms=250, rps=2.5, fail_ratio=0.2)
    assert [b.split()[0] for b in breaches] == ["p95_ms", "p99_ms", "min_rps", "max_fail_ratio"]
    assert "150.0 > 100" in breaches[0] and "2.50 < 10" in breaches[2]


def test_a_single_breach_is_reported_alone() -> None:
    breaches = check_slos(LIMITS, requests=50, p95_ms=50, p99_ms=250, rps=20, fail_ratio=0.0)
    assert breaches == ["p99_ms 250.0 > 200"]


def test_no_traffic_is_a_breach() -> None:
    assert check_slos(LIMITS, requests=0, p95_ms=0, p99_ms=0, rps=0, fail_ratio=0)


def test_summary_drops_warmup_and_counts_failures() -> None:
    samples = [(0.5, 1000.0, True)]  # before the window: ignored
    samples += [(1.0 + i * 0.1, float(i + 1), True) for i in range(100)]  # 1..100 ms
    samples += [(5.0, 7.0, False)]
    s = summarize(samples, begin=1.0, texts_per_request=4)
    assert s.requests == 100 and s.failures == 1
    assert s.window_s == pytest.approx(9.9)
    assert s.rps == pytest.approx(100 / 9.9)
    assert s.sentences_per_s == pytest.approx(4 * 100 / 9.9)
    assert s.p50_ms == pytest.approx(50.5)
    assert s.p99_ms == pytest.approx(99.01)


def test_summary_of_nothing_is_nan_not_an_error() -> None:
    s = summarize([], begin=0.0, texts_per_request=1)
    assert s.requests == 0 and s.rps == 0 and math.isnan(s.p50_ms)


def test_validate_accepts_unit_rows_and_rejects_broken_ones() -> None:
    rng = np.random.default_rng(0)
    good = rng.normal(size=(3, 48)).astype(np.float32)
    good /= np.linalg.norm(good, axis=1, keepdims=True)
    validate(good, 3, 48)
    with pytest.raises(ValidationError, match="shape"):
        validate(good, 2, 48)
    with pytest.raises(ValidationError, match=r"expected \[3, 48\]"):
        validate(good[:, :16], 3, 48)
    bad = good.copy()
    bad[1, 0] = np.nan
    with pytest.raises(ValidationError, match="non-finite"):
        validate(bad, 3, 48)
    with pytest.raises(ValidationError, match="norm"):
        validate(good * 1.01, 3, 48)


def test_validate_classification_checks_distribution_labels_and_argmax() -> None:
    known = ("negative", "neutral", "positive")
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], dtype=np.float32)
    validate_classification(probs, ["negative", "positive"], 2, known)
    with pytest.raises(ValidationError, match="shape"):
        validate_classification(probs[:, :2], ["negative", "positive"], 2, known)
    with pytest.raises(ValidationError, match="sums to 1"):
        validate_classification(probs * 0.5, ["negative", "positive"], 2, known)
    with pytest.raises(ValidationError, match="not one of"):
        validate_classification(probs, ["negative", "happy"], 2, known)
    with pytest.raises(ValidationError, match="not the most probable"):
        validate_classification(probs, ["neutral", "positive"], 2, known)
    with pytest.raises(ValidationError, match="2 texts"):
        validate_classification(probs, ["negative"], 2, known)


def test_corpus_is_deterministic_with_the_documented_mix() -> None:
    texts = corpus.generate()
    assert texts == corpus.generate()
    assert texts != corpus.generate(seed=corpus.DEFAULT_SEED + 1)
    assert len(texts) == corpus.DEFAULT_SIZE
    words = np.array([len(t.split()) for t in texts])
    mix = corpus.LengthMix()
    assert words.min() >= mix.query_words[0] and words.max() <= mix.passage_words[1]
    # shares within a few points of 30% / 50% / 20%
    assert abs(np.mean(words <= mix.query_words[1]) - 0.3) < 0.05
    assert abs(np.mean(words >= mix.passage_words[0]) - 0.2) < 0.05
    assert all(t.strip() for t in texts)


def _cell(target: Target, summary: dict[str, float], status: str = "ok") -> Cell:
    return Cell(target, 16, summary, 0 if status == "ok" else 1, status, 0.1, {}, 12.5)


def test_bench_aggregates_a_failed_round_without_losing_the_cell() -> None:
    """The KeyError('window_s') crash: a failed round has none of the sample keys."""
    ens = Target("triton", "grpc", "ensemble", "fp32", "perf_analyzer")
    bls = Target("triton", "grpc", "bls", "fp32", "perf_analyzer")
    good = {"requests": 100, "failures": 0, "sentences_per_s": 50.0, "p50_ms": 10.0,
            "p95_ms": 20.0, "p99_ms": 30.0, "window_s": 5.0}  # fmt: skip
    stalled = {"requests": 0, "failures": -1, "sentences_per_s": 0.0}  # the old failure summary
    cells = [
        _cell(ens, good),
        _cell(ens, dict(EMPTY_SUMMARY), "failed: perf_analyzer stalled: killed after 80 s"),
        _cell(bls, good),
        _cell(bls, stalled, "stalled twice (killed after 67 s)"),
    ]
    inproc = [{"variant": "fp32", "batch": 1, "sentences_per_s": 100.0, "p50_ms": 5.0,
               "p95_ms": 6.0, "p99_ms": 7.0}]  # fmt: skip
    merged, ip = aggregate(cells, inproc)
    by = {c.target: c for c in merged}
    assert by[ens].summary["sentences_per_s"] == 50.0  # the NaN round does not drag the median
    assert by[ens].summary["window_s"] == 5.0
    assert by[ens].status == "1/2 rounds: failed: perf_analyzer stalled: killed after 80 s"
    assert by[bls].status.startswith("1/2 rounds: stalled twice")
    rows, lines = analyse(merged, ip)
    assert any(line.startswith("MISSED") and "BLS fp32 grpc/pa @16" in line for line in lines)
    assert any("0.50x the in-process batch-1 limit" in line for line in lines)
    text = table(rows, ip)
    assert "1/2 rounds: failed" in text and "ensemble fp32 grpc/pa" in text
    assert rows[0]["server_cpu_ms_per_request"] == 12.5


def test_bench_reports_the_in_process_limit_targets_for_every_text_pipeline() -> None:
    """Issue 20 item 2: p50 at 1 client <= in-process + 2 ms, 16 clients >= 0.9x the in-process
    batch-1 limit, for the embedding *and* the classification ensembles, each with its ratio."""

    def row(task: str, name: str, conc: int, p50: float, thr: float) -> Cell:
        target = Target("triton", "grpc", "ensemble", "fp32", "perf_analyzer", name, task=task)
        summary = {"requests": 100, "failures": 0, "sentences_per_s": thr, "p50_ms": p50,
                   "p95_ms": p50, "p99_ms": p50, "window_s": 5.0}  # fmt: skip
        return Cell(target, conc, summary, 0, "ok", 0.1, {}, 12.5)

    cells = [
        row("embedding", "embed", 1, 6.5, 150.0),  # +2.5 ms: missed
        row("embedding", "embed", 16, 6.5, 95.0),  # 0.95x: met, moonshot missed
        row("classification", "classify", 1, 5.9, 150.0),  # +1.9 ms: met
        row("classification", "classify", 16, 5.9, 210.0),  # 1.05x: met, moonshot met
    ]
    inproc = [
        {"task": task, "name": name, "variant": "fp32", "batch": 1, "sentences_per_s": 100.0 * k,
         "p50_ms": 4.0, "p95_ms": 5.0, "p99_ms": 6.0}
        for task, name, k in (("embedding", "embed", 1), ("classification", "classify", 2))
    ]  # fmt: skip
    _, lines = analyse(cells, inproc)
    wanted = [
        "MISSED fp32 ensemble grpc/pa @1: p50 6.5 ms = in-process batch-1 p50 +2.5 ms "
        "(target <= +2 ms; ratio 1.62x)",
        "MET    fp32 ensemble grpc/pa @16: 0.95x the in-process batch-1 limit "
        "(target >= 0.90x, moonshot missed: >= 1.0x)",
        "MET    classify ensemble fp32 grpc/pa @1: p50 5.9 ms = in-process batch-1 p50 +1.9 ms "
        "(target <= +2 ms; ratio 1.48x)",
        "MET    classify ensemble fp32 grpc/pa @16: 1.05x the in-process batch-1 limit "
        "(target >= 0.90x, moonshot met: >= 1.0x)",
    ]
    for line in wanted:
        assert line in lines, f"{line!r} not in {lines}"
    # each verdict is followed by its measured cause
    causes = [i for i, line in enumerate(lines) if line.startswith(CAUSE)]
    assert [lines[i - 1] for i in causes] == wanted


def test_a_text_targets_cause_splits_the_time_inside_and_outside_the_models() -> None:
    """A lone request: its time inside the route's models (Triton's statistics per request, the
    ensemble's own left out) and outside them; the top concurrency: the server's CPU per request
    against the cores and the in-process limit."""

    def stats(n: int, **ms: float) -> dict[str, float]:
        out: dict[str, float] = {"inference_count": float(n)}
        for key, v in ms.items():
            out[f"{key}_ns"], out[f"{key}_count"] = v * 1e6 * n, float(n)
        return out

    row = {
        "model": "embed", "p50_ms": 6.5, "server_cpu_ms_per_request": 12.5,
        "concurrency": 1, "sentences_per_s": 125.0,  # 8.0 ms a request
        "server_stats": {
            "embed": stats(100, queue=0.5, compute_infer=9.0),  # the ensemble: left out
            "fused_fp32": stats(100, queue=0.1, compute_input=0.2, compute_infer=3.0,
                                compute_output=0.1),
        },
    }  # fmt: skip
    assert server_split(row) == pytest.approx((0.1, 3.3))
    assert one_client_cause(row, 200.0) == (
        "a request takes 8.0 ms on average against the loop in process's 5.0: inside the models "
        "3.4 ms (queues 0.10, compute 3.3), outside them 4.6 ms (the front, the protocols, the "
        "client)"
    )
    free = throughput_cause(row, 100.0, 1.0, cores=2)
    assert free.startswith("not CPU-bound: the server spends 12.5 ms of CPU a request, so 2")
    assert "at most 160/s against the in-process limit's 100/s; 0.1 ms" in free
    assert throughput_cause(row, 170.0, 1.0, cores=2).startswith("CPU-bound")
    bare = {"model": "embed", "p50_ms": 6.5, "server_stats": {}}
    assert "no server statistics" in one_client_cause(bare, 200.0)
    assert "no server CPU figure" in throughput_cause(bare, 100.0, 1.0)


def test_bench_loads_classifiers_with_perf_analyzer_too_on_their_discovered_input() -> None:
    """Issue 20 item 2's targets are measured with perf_analyzer over gRPC for the classification
    ensembles as well; each text goes in as the pipeline's own input."""
    import argparse

    from tritonforge.loadtest.bench.cells import targets_from
    from tritonforge.pipelines import Pipeline

    pipeline = Pipeline("reviews", "classification", {"fp32": "reviews"}, None, (), "review", ())
    args = argparse.Namespace(
        locust_protocols=["http"], pa_protocols=["grpc"], pipelines=["ensemble"], variants=["fp32"]
    )
    targets = targets_from(args, pipeline)
    pa = [t for t in targets if t.generator == "perf_analyzer"]
    assert [(t.model, t.protocol, t.input_name, t.task) for t in pa] == [
        ("reviews", "grpc", "review", "classification")
    ]


def test_bench_reports_a_cell_that_never_answered_as_nan() -> None:
    ens = Target("triton", "grpc", "ensemble", "fp32", "perf_analyzer")
    merged, _ = aggregate([_cell(ens, dict(EMPTY_SUMMARY), "failed: x")], [])
    assert math.isnan(merged[0].summary["p99_ms"]) and merged[0].status == "1/1 rounds: failed: x"


def test_bench_chart_is_written_when_every_served_cell_failed(tmp_path: Path) -> None:
    """The chart crashed ("Data cannot be log-scaled") after the table when no cell answered
    (e.g. perf_analyzer not installed): p99 bars were all NaN on a log axis."""
    ens = Target("triton", "grpc", "ensemble", "fp32", "perf_analyzer")
    merged, ip = aggregate([_cell(ens, dict(EMPTY_SUMMARY), "failed: x")], [])
    rows, _ = analyse(merged, ip)
    path = tmp_path / "bench.png"
    chart(rows, ip, path)
    assert path.stat().st_size > 0


def test_bench_process_never_imports_locust() -> None:
    """Importing locust monkey-patches the whole process for gevent; the bench process hosts the
    embedded server's front (asyncio in a thread), which then hung at start."""
    import subprocess
    import sys

    code = (
        "import sys; import loadtest.bench.cli; import loadtest.bench.runners as b; b.machine(); "
        "print('gevent' in sys.modules or 'locust' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_every_loadtest_exception_derives_from_loadtest_error() -> None:
    """One base per package (issue #21): each exception class in loadtest/ reaches
    ``LoadtestError`` (itself a ``TritonforgeError``) through loadtest's own classes, never a
    bare builtin. Read from the source: importing the locustfiles would patch this process."""
    import ast
    from pathlib import Path

    from tritonforge.errors import TritonforgeError
    from tritonforge.loadtest.errors import LoadtestError

    assert issubclass(LoadtestError, TritonforgeError)
    root = Path(__file__).resolve().parents[2] / "loadtest"
    bases: dict[str, list[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                bases[node.name] = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
    assert bases.pop("LoadtestError") == ["TritonforgeError"]

    def reaches(name: str) -> bool:
        return name == "LoadtestError" or any(reaches(b) for b in bases.get(name, []))

    for name, parents in bases.items():
        assert parents and all(p in bases or p == "LoadtestError" for p in parents), name
        assert reaches(name), name


def test_task_hooks_validate_answers_whatever_the_protocol() -> None:
    """The task hooks of the base users (issue #21 item 5): one validator per task reads the
    answer through ``fetch``, so the HTTP (JSON) and gRPC (numpy) users share it. In a subprocess:
    importing Locust patches the process for gevent."""
    import subprocess
    import sys

    code = """
from types import SimpleNamespace as NS
import numpy as np
from tritonforge.loadtest.locust import base
from tritonforge.tasks.classification.loadtest import locustfile as classify
from tritonforge.tasks.embedding.loadtest import locustfile as embed
from tritonforge.loadtest.slo import ValidationError

task = embed.EmbedTask()
task.pipeline = NS(outputs=[NS(name="embedding")], dim=2)
rows = np.array([[0.6, 0.8], [1.0, 0.0]], np.float32)
answer = {"outputs": [{"name": "embedding", "shape": [2, 2], "data": rows.ravel().tolist()}]}
task.validate(lambda name, dtype=np.float32: base.triton_output(answer, name, dtype), 2)
sizes = []
task.validate(base._sized(lambda name: rows, sizes), 2)
assert sizes == [rows.nbytes], sizes
try:
    task.validate(base._sized(lambda name: rows, []), 3)
    raise SystemExit("3 rows expected, 2 accepted")
except ValidationError:
    pass
try:
    task.validate(base._sized(lambda name: None, []), 2)
    raise SystemExit("a missing output accepted")
except ValidationError:
    pass

task = classify.ClassifyTask()
task.pipeline = NS(labels=["neg", "pos"])
probs = {"probabilities": np.array([[0.2, 0.8]], np.float32), "label": np.array([[b"pos"]])}
task.validate(base._sized(probs.__getitem__, []), 1)
probs["label"] = np.array([[b"neg"]])
try:
    task.validate(base._sized(probs.__getitem__, []), 1)
    raise SystemExit("a label that is not the most probable accepted")
except ValidationError:
    pass
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_in_process_limit_is_its_best_round_not_a_starved_median() -> None:
    """The bench's 12:18 run: 112.9 then 33.4 sentences/s for the same graph when neighbours
    started; the median (73.2) let every served pipeline "meet" the limit targets."""
    rounds = [
        {"variant": "fp32", "batch": 1, "sentences_per_s": 112.9, "p50_ms": 6.6, "p99_ms": 30.7},
        {"variant": "fp32", "batch": 1, "sentences_per_s": 33.4, "p50_ms": 23.6, "p99_ms": 90.0},
    ]
    _, (limit,) = aggregate([], rounds)
    assert (limit["sentences_per_s"], limit["p50_ms"], limit["p99_ms"]) == (112.9, 6.6, 30.7)
    assert limit["rounds_sentences_per_s"] == [112.9, 33.4] and limit["repeats"] == 2
    ens = Target("triton", "grpc", "ensemble", "fp32", "perf_analyzer")
    served = {"requests": 100, "failures": 0, "sentences_per_s": 95.4, "p50_ms": 11.2,
              "p95_ms": 20.0, "p99_ms": 30.0, "window_s": 5.0}  # fmt: skip
    _, lines = analyse([_cell(ens, served)], [limit])
    assert any(line.startswith("MISSED") and "0.84x the in-process" in line for line in lines)
