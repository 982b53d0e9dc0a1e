"""The CPU as /proc/cpuinfo describes it (one reading for the ORT graph cache, the llama.cpp
build and the bench's machine line)."""

from __future__ import annotations

from pathlib import Path

from tritonforge.host import cpu_flags, cpu_model


def test_host_cpu_flags_reads_the_first_cpu(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n\nflags\t: other\n")
    assert cpu_flags(info) == frozenset({"fpu", "avx2", "avx512f"})
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_cpu_model_reads_the_first_cpu(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\n\nmodel name\t: other\n")
    assert cpu_model(info) == "AMD EPYC"
    assert cpu_model(tmp_path / "missing") == "unknown"
