"""``loadtest.bench.hops``: the per-hop breakdown's repository trimming and report."""

from __future__ import annotations

from pathlib import Path

from tritonforge.loadtest.bench.hops import Hop, report, trimmed_repository


def test_trimmed_repository_holds_only_the_named_models(tmp_path: Path) -> None:
    for name in ("embed", "tokenizer", "generate"):
        (tmp_path / name / "1").mkdir(parents=True)
    with trimmed_repository(tmp_path, ["embed", "tokenizer"]) as root:
        assert sorted(p.name for p in root.iterdir()) == ["embed", "tokenizer"]
        assert (root / "embed" / "1").is_dir()
    assert not root.exists()


def test_report_shows_each_hop_with_its_server_cpu_and_stage_statistics() -> None:
    hop = Hop("ensemble", "front")
    hop.latency_ms = [10.0, 12.0, 11.0]
    hop.client_cpu_s = 0.003
    stats = {"queue": 0.1, "compute_input": 0.05, "compute_infer": 9.0, "compute_output": 0.2}
    result = {
        "ensemble": "embed",
        "load_average_at_start": (1.5, 0, 0),
        "load_average_at_end": (2.5, 0, 0),
        "hops": [hop.summary()],
        "servers": {
            "ensemble/front": {
                "tritonserver_tree_cpu_ms": 14.0,
                "stub_cpu_ms": {"encoder_fp32": 12.5},
                "stats": {"encoder_fp32": stats},
            }
        },
    }
    text = report(result)
    assert "load average 1.50 -> 2.50" in text
    row = next(line for line in text.splitlines() if line.startswith("ensemble"))
    assert row.split() == ["ensemble", "front", "11.00", "11.00", "1.00", "14.00"]
    assert "infer   9.00" in text and "stub cpu  12.50" in text


def test_hops_serves_every_model_the_ensemble_calls(tmp_path: Path) -> None:
    """`bench.hops --pipeline-name classify` failed to start: its trimmed repository held the
    ensemble, tokenizer and encoder only, not the postprocess step the ensemble calls."""
    from tritonforge.loadtest.bench.hops import Subject, ensemble_steps

    steps = ("tok", "enc", "post")
    step_text = "".join(
        f'step {{ model_name: "{m}" model_version: -1 input_map {{ key: "a" value: "a" }} '
        f'output_map {{ key: "b" value: "b" }} }}\n'
        for m in steps
    )
    (tmp_path / "ens").mkdir()
    (tmp_path / "ens" / "config.pbtxt").write_text(
        f'name: "ens"\nplatform: "ensemble"\nmax_batch_size: 8\nensemble_scheduling {{\n{step_text}}}\n'
    )
    for m in (*steps, "one", "labels"):
        (tmp_path / m).mkdir()
        (tmp_path / m / "config.pbtxt").write_text(f'name: "{m}"\nbackend: "python"\n')
    assert ensemble_steps(tmp_path, "ens") == steps
    sub = Subject(tmp_path, None, "ens", "tok", "enc", None, None, steps)  # type: ignore[arg-type]
    assert sub.models == ["ens", "tok", "enc", "post"]
    # a fused step: the models it names in its parameters are served with it
    (tmp_path / "one" / "config.pbtxt").write_text(
        'name: "one"\nbackend: "python"\n'
        'parameters { key: "postprocess_model" value: { string_value: "labels" } }\n'
        'parameters { key: "encoder_models" value: { string_value: "fp32=enc" } }\n'
    )
    (tmp_path / "fused").mkdir()
    (tmp_path / "fused" / "config.pbtxt").write_text(
        'name: "fused"\nplatform: "ensemble"\nmax_batch_size: 8\nensemble_scheduling {\n'
        + step_text.split("\n")[0].replace('"tok"', '"one"')
        + "\n}\n"
    )
    assert ensemble_steps(tmp_path, "fused") == ("one", "enc", "labels")
