"""The generation side-by-side bench's pure parts: goals vs llama.cpp q8_0, greedy agreement,
the llama.cpp build flags and layout, the GenAI thread setting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tritonforge.loadtest.anchors import extras, llamacpp, ortgenai
from tritonforge.loadtest.bench.generate import PROMPTS, Cell, run_cell
from tritonforge.loadtest.bench.generate_causes import StepTimes, cause
from tritonforge.loadtest.bench.generate_llamacpp import (
    ANCHOR,
    GOALS,
    agreement,
    decode_tok_s,
    evaluate,
)


def cell(
    target: str, conc: int, tok_s: float, ttft_ms: float, itl_ms: float, p99_ms: float = 0.0
) -> Cell:
    return Cell(target, conc, 8, 0, 1.0, tok_s, ttft_ms, ttft_ms, itl_ms, 0.0, 0.0, p99_ms)


def test_goals_compare_each_row_with_llamacpp_q8_and_mark_met_or_missed() -> None:
    cells = [
        cell(ANCHOR, 1, 80, 70, 12.5),  # 80 tok/s decode
        cell(ANCHOR, 8, 160, 300, 40),
        cell(ANCHOR, 16, 200, 1000, 60, 57),
        cell("ours", 1, 70, 60, 10.0),  # 100 tok/s decode: 1.25x
        cell("ours", 8, 180, 250, 40),  # 1.125x < 1.5: missed
        cell("ours", 16, 300, 700, 50, 60),  # 1.5x met; TTFT 0.7x met; ITL p99 60 > 57 missed
    ]
    goals = {g["target"].split(": ", 1)[1]: g for g in evaluate(cells, "ours")}
    assert len(goals) == len(GOALS)
    single = goals[f"single-stream decode tok/s >= 1.0x {ANCHOR}"]
    assert single["ratio"] == pytest.approx(1.25) and single["met"] is True
    assert goals[f"8 streams aggregate tok/s >= 1.5x {ANCHOR}"]["met"] is False
    assert goals[f"16 streams aggregate tok/s >= 1.5x {ANCHOR}"]["met"] is True
    assert goals[f"16 streams inter-token p99 <= 1.0x {ANCHOR}"]["met"] is False
    ttft = goals[f"16 streams TTFT p50 <= 0.8x {ANCHOR}"]
    assert ttft["ratio"] == pytest.approx(0.7) and ttft["met"] is True


def test_goals_without_the_anchor_are_not_applicable_rather_than_missed() -> None:
    goals = evaluate([cell("ours", 1, 70, 60, 10.0)], "ours")
    assert all(g["met"] is None and g["ratio"] is None for g in goals)


def test_fresh_prompts_never_repeat_a_request_and_keep_each_prompts_text() -> None:
    """``--fresh-prompts``: a tagged cell sends no prompt twice (the prompt caches of both
    servers can serve only the shared start), each still the bench prompt it extends, and the
    same tag sends the same prompts (every target gets the same requests); untagged cells
    repeat the 8 prompts, as the targets' cells do."""

    def sent(tag: str | None, concurrency: int, per_client: int) -> list[str]:
        prompts: list[str] = []

        def stream(prompt: str, max_tokens: int):  # type: ignore[no-untyped-def]
            prompts.append(prompt)
            yield "a b"

        texts: dict[str, str] = {}
        c = run_cell("t", stream, lambda t: len(t.split()), concurrency, per_client, 4, texts, tag)
        assert c.failures == 0 and set(texts) <= set(PROMPTS)  # kept by the bench prompt
        return prompts

    fresh = sent("0.16", 16, 1) + sent("0.1", 1, 8)
    assert len(set(fresh)) == len(fresh) == 24
    assert all(any(p.startswith(f"{q} (request ") for q in PROMPTS) for p in fresh)
    assert sorted(sent("0.16", 16, 1)) == sorted(fresh[:16])
    plain = sent(None, 16, 1)
    assert set(plain) == set(PROMPTS) and len(plain) == 16


def test_each_goals_cause_is_said_in_the_runs_step_times() -> None:
    """A rate under the step's ceiling with the ceiling under the goal is the step itself;
    with room under the ceiling it is the serving path; TTFT names the prefix cache (the
    bench's repeated prompts) or the serial batch-1 tails (fresh prompts) with their times."""
    steps = StepTimes({1: 8.0, 16: 25.0}, tail_ms=30.0, past=72, tail_tokens=20)
    one = cause("decode_tok_s", 1, 1.0, 100.0, 150.0, steps, False)
    assert one.startswith("the step itself") and "8.0 ms" in one and "at most 125 tok/s" in one
    sixteen = cause("tokens_per_s", 16, 1.5, 384.0, 360.0, steps, False)
    assert sixteen.startswith("the serving path") and "at most 640 tok/s" in sixteen
    assert "60% of it" in sixteen
    assert cause("tokens_per_s", 16, 1.5, 400.0, 500.0, steps, False).startswith("the step")
    cached = cause("ttft_p50_ms", 16, 0.8, 47.0, 123.0, steps, False)
    assert "prefix cache's logits" in cached and "~30 ms" in cached
    fresh = cause("ttft_p50_ms", 16, 0.8, 319.0, 372.0, steps, True)
    assert "batch-1 call" in fresh and "20 tokens take 30.0 ms" in fresh and "480 ms" in fresh
    itl = cause("itl_p99_ms", 16, 1.0, 94.0, 65.0, steps, True)
    assert "25.0 ms" in itl and "(69 ms)" in itl


def test_decode_rate_is_the_inverse_of_the_median_inter_token_latency() -> None:
    assert decode_tok_s(cell("x", 1, 1, 1, 20.0)) == pytest.approx(50.0)
    assert math.isnan(decode_tok_s(cell("x", 1, 1, 1, float("nan"))))


def test_agreement_is_the_common_prefix_fraction_of_the_reference() -> None:
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    assert agreement([1, 2, 3, 4], [1, 2]) == 0.5
    assert agreement([1, 2], [7]) == 0.0


AVX2_HOST = frozenset({"avx", "avx2", "fma", "f16c"})
# AMD Zen 4 (this machine, 2026-12-02): AVX-512 with VNNI and BF16, no AMX
ZEN4_HOST = AVX2_HOST | frozenset(
    {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512_vnni", "avx512_bf16"}
)
AMX_HOST = ZEN4_HOST | frozenset({"amx_tile", "amx_int8", "amx_bf16", "avx512vbmi"})


def _enabled(flags: frozenset[str]) -> set[str]:
    return {f for f in llamacpp.cmake_flags(flags) if f.endswith("=ON")}


def test_llamacpp_builds_avx2_without_avx512_on_an_avx2_host() -> None:
    """AVX-512 would SIGILL on AVX2-only hosts (AMD Zen 2)."""
    flags = set(llamacpp.cmake_flags(AVX2_HOST))
    assert "-DGGML_NATIVE=OFF" in flags
    assert {"-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"} <= flags
    assert not [f for f in _enabled(AVX2_HOST) if "AVX512" in f or "AMX" in f]


def test_llamacpp_uses_the_hosts_avx512_parts_but_never_amx() -> None:
    """A build without the host's VNNI handicaps the q8_0 anchor; a native build enabled AMX
    and crashed on the first quantized matmul in a VM."""
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON"} <= _enabled(
        ZEN4_HOST
    )
    assert "-DGGML_AVX512_VBMI=OFF" in llamacpp.cmake_flags(ZEN4_HOST)
    assert not [f for f in _enabled(AMX_HOST) if "AMX" in f]
    # VNNI without the AVX-512 base is not enough for ggml's AVX512 option
    assert not [f for f in _enabled(AVX2_HOST | {"avx512_vnni"}) if "AVX512" in f]


def test_layout_is_not_built_until_binaries_for_this_host_and_ggufs_exist(
    tmp_path: Path,
) -> None:
    layout = llamacpp.Layout(tmp_path)
    assert not layout.built(ZEN4_HOST)
    for t in llamacpp.TARGETS:
        layout.binary(t).parent.mkdir(parents=True, exist_ok=True)
        layout.binary(t).write_bytes(b"")
    for q in llamacpp.QUANTS:
        layout.gguf(q).write_bytes(b"")
    assert not layout.built(ZEN4_HOST)  # no record of what the binaries were built for
    layout.isa_file.write_text(llamacpp.isa_stamp(ZEN4_HOST))
    assert layout.built(ZEN4_HOST)
    assert not layout.built(AVX2_HOST)  # AVX-512 binaries copied to an AVX2 host: rebuild


def test_llama_server_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(llamacpp.LlamaCppError, match="make llamacpp"):
        llamacpp.LlamaServer(llamacpp.Layout(tmp_path), "q8_0").start()


def test_genai_threads_are_written_into_the_decoder_session_options(tmp_path: Path) -> None:
    config = tmp_path / "genai_config.json"
    config.write_text(json.dumps({"model": {"decoder": {"filename": "model.onnx"}}}))
    ortgenai.set_threads(config, 2)
    options = json.loads(config.read_text())["model"]["decoder"]["session_options"]
    assert options["intra_op_num_threads"] == 2 and options["inter_op_num_threads"] == 1


# `make llamacpp` alone on a fresh venv: the bench extra (sentencepiece) is installed first
REQUIRES = [
    "numpy<2",
    'pytest==9.2.0; extra == "dev"',
    'sentencepiece==0.2.3; extra == "bench"',
    'uvloop; sys_platform != "win32"',
]


def test_the_bench_extra_is_its_own_requirements_only() -> None:
    reqs = extras.extra_requirements(REQUIRES, "bench")
    assert [str(r.name) for r in reqs] == ["sentencepiece"]
    assert extras.extra_requirements(REQUIRES, "nothing") == []


def test_an_extra_requirement_absent_or_off_its_pin_is_missing() -> None:
    reqs = extras.extra_requirements(REQUIRES, "bench")
    assert extras.missing(reqs, {"sentencepiece": "0.2.3"}.get) == []
    assert extras.missing(reqs, {}.get) == reqs
    assert extras.missing(reqs, {"sentencepiece": "0.1.99"}.get) == reqs


def test_the_install_command_pins_without_the_marker_under_the_lock(tmp_path: Path) -> None:
    reqs = extras.extra_requirements(REQUIRES, "bench")
    lock = tmp_path / "constraints.txt"
    cmd = extras.pip_install_command(reqs, lock)
    assert cmd[1:] == ["-m", "pip", "install", "-c", str(lock), "sentencepiece==0.2.3"]
    assert "-c" not in extras.pip_install_command(reqs, None)


def test_this_projects_bench_extra_holds_what_convert_hf_to_gguf_imports() -> None:
    from importlib import metadata

    names = {
        r.name for r in extras.extra_requirements(metadata.requires("tritonforge") or [], "bench")
    }
    assert "sentencepiece" in names


def test_the_llamacpp_build_installs_the_bench_extra_before_compiling(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(llamacpp, "ensure_extra", lambda extra, lock: calls.append(extra))
    monkeypatch.setattr(llamacpp, "build_binaries", lambda *a: calls.append("binaries"))
    monkeypatch.setattr(llamacpp, "make_ggufs", lambda *a: calls.append("ggufs"))
    llamacpp.build(llamacpp.Layout(tmp_path))
    assert calls == ["bench", "binaries", "ggufs"]
