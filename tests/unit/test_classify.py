"""Classification postprocessing, the top-1 int8 gate, and version choice: pure functions."""

from __future__ import annotations

import numpy as np
import pytest

from tritonforge.bls import BlsPlan, TokenizerSettings
from tritonforge.bls_parameters import canary_bucket, request_version
from tritonforge.classify import check_top_k, classify, read_labels, softmax
from tritonforge.errors import InvalidInputError, ModelConfigError, NumericalError
from tritonforge.export.quantize import gate_figures, passes
from tritonforge.export.spec import QualityGate
from tritonforge.text import TextLimits

LABELS = ("negative", "neutral", "positive")


def test_classify_outputs_label_score_probabilities_and_top_k() -> None:
    logits = np.array([[0.0, 1.0, 3.0], [2.0, 2.0, -1.0]], dtype=np.float32)
    out = classify(logits, LABELS, top_k=2)
    np.testing.assert_allclose(out["probabilities"].sum(1), 1.0, atol=1e-6)
    assert [x.decode() for x in out["label"].reshape(-1)] == ["positive", "negative"]
    assert out["top_labels"].tolist() == [[b"positive", b"neutral"], [b"negative", b"neutral"]]
    np.testing.assert_allclose(out["score"][:, 0], out["probabilities"].max(1))
    assert out["top_scores"].shape == (2, 2) and out["label"].shape == (2, 1)


def test_classify_refuses_wrong_width_and_non_finite_logits() -> None:
    with pytest.raises(ModelConfigError, match="one per label"):
        classify(np.zeros((1, 2), np.float32), LABELS, 1)
    with pytest.raises(NumericalError, match="row 1"):
        classify(np.array([[0, 0, 0], [np.nan, 0, 0]], np.float32), LABELS, 1)


def test_softmax_is_stable_for_large_logits() -> None:
    p = softmax(np.array([[1000.0, 0.0, -1000.0]]))
    assert np.isfinite(p).all() and p[0, 0] == pytest.approx(1.0)


@pytest.mark.parametrize("value", [0, 4, -1, "x", 1.5, True, None])
def test_top_k_out_of_range_names_the_field(value: object) -> None:
    with pytest.raises(InvalidInputError, match="top_k"):
        check_top_k(value, 3)


def test_top_k_accepts_strings_of_ints() -> None:
    assert check_top_k("2", 3) == 2


def test_label_file_needs_two_distinct_labels(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "labels.txt"
    path.write_text("a\nb\n")
    assert read_labels(path) == ("a", "b")
    path.write_text("a\na\n")
    with pytest.raises(ModelConfigError, match="distinct"):
        read_labels(path)


def test_top1_gate_counts_agreement_and_the_largest_probability_move() -> None:
    ref = [np.array([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0]])]
    gate = QualityGate("logits", metric="top1", top1_agreement_min=0.99, max_prob_diff_max=0.1)

    def runner(logits: np.ndarray):  # type: ignore[no-untyped-def]
        return lambda _inputs: {"logits": logits}

    same = gate_figures(runner(ref[0]), [{}], ref, gate)
    assert same["top1_agreement"] == 1.0 and same["max_prob_diff"] == 0.0 and passes(same, gate)
    flipped = gate_figures(runner(np.array([[3.0, 0, 0], [3.0, 0, 0]])), [{}], ref, gate)
    assert flipped["top1_agreement"] == 0.5 and not passes(flipped, gate)
    nudged = gate_figures(runner(np.array([[2.0, 0, 0], [0, 3.0, 0]])), [{}], ref, gate)
    assert nudged["top1_agreement"] == 1.0 and nudged["max_prob_diff"] > 0.1
    assert not passes(nudged, gate)


def _plan(versions: tuple[int, ...], weights: dict[int, int]) -> BlsPlan:
    return BlsPlan(
        text_input="text",
        output="logits",
        tokenizer=TokenizerSettings("tok", __import__("pathlib").Path("t.json"), 16, 1),
        encoders={},
        default_variant="fp32",
        missing={},
        limits=TextLimits(),
        stage_timeout_ms=0,
        versions=versions,
        weights=weights,
    )


def test_version_pinned_by_parameter_else_split_by_request_id() -> None:
    plan = _plan((1, 2), {1: 80, 2: 20})
    assert request_version({"version": 1}, "x", plan) == 1
    assert request_version('{"version": "2"}', "x", plan) == 2
    for key in ("a", "b", "request-17"):
        expected = 1 if canary_bucket(key) < 80 else 2
        assert request_version({}, key, plan) == expected
        assert request_version(None, key, plan) == expected  # deterministic
    shares = [request_version({}, f"id-{i}", plan) for i in range(2000)]
    assert 0.75 < shares.count(1) / len(shares) < 0.85


@pytest.mark.parametrize("value", [3, 0, "latest", True])
def test_unknown_version_names_the_parameter(value: object) -> None:
    with pytest.raises(InvalidInputError, match="'version'"):
        request_version({"version": value}, "x", _plan((1, 2), {}))


def test_single_version_pipeline_uses_latest() -> None:
    assert request_version({}, "x", _plan((), {})) == -1


@pytest.mark.parametrize(
    "value", ["9" * 10_240, "x" * 10_240, 10**4000, ["k"] * 3000], ids=["9s", "xs", "int", "list"]
)
def test_a_10kb_version_or_top_k_is_refused_without_echoing_it(value: object) -> None:
    """Issue #19 finding 7: a 10 KB value came back in a 10,3xx-byte error (over gRPC it overflowed
    the metadata limit: RESOURCE_EXHAUSTED)."""
    with pytest.raises(InvalidInputError, match="'version'") as version_err:
        request_version({"version": value}, "x", _plan((1, 2), {}))
    with pytest.raises(InvalidInputError, match="'top_k'") as top_k_err:
        check_top_k(value, 3)
    for err in (version_err, top_k_err):
        assert len(str(err.value)) < 200, str(err.value)[:300]


def test_parameters_with_an_integer_past_4300_digits_are_a_clear_400() -> None:
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        request_version('{"version": ' + "9" * 5000 + "}", "x", _plan((1, 2), {}))


@pytest.mark.parametrize("value", ["²", "٣", " 2 "])
def test_top_k_strings_must_be_ascii_integers(value: str) -> None:
    if value.strip() == "2":
        assert check_top_k(value, 3) == 2
        return
    with pytest.raises(InvalidInputError, match="'top_k'"):
        check_top_k(value, 3)
