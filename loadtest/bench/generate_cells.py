"""The served-generation bench's cells: one request's timing, one cell's figures, medians over
rounds, how a streamed chunk's tokens are counted (several per chunk under a stream
interval), and the cells' chart."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Timing:
    """One request: seconds from submit to the first chunk and to each later chunk, tokens."""

    first_s: float = float("nan")
    end_s: float = float("nan")
    chunk_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)  # tokens each chunk carries
    tokens: int = 0
    error: str | None = None


@dataclass
class Cell:
    target: str
    concurrency: int
    requests: int
    failures: int
    window_s: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    latency_p50_ms: float
    latency_p99_ms: float
    # over every token after the first of every request: a chunk carrying k tokens after a gap
    # of g ms counts k tokens of g / k ms each (a stream interval sends several per response)
    itl_p99_ms: float = float("nan")
    chunk_gap_p99_ms: float = float("nan")  # over every gap between chunks, whatever they carry
    round: int = 0


def chunk_tokens(chunks: Sequence[str], count_tokens: Callable[[str], int]) -> list[int]:
    """Tokens each chunk carries: the growth of the token count of the text so far (counted
    after the stream ends, so that the client's tokenizing never competes with the server)."""
    counts, text = [0], ""
    for chunk in chunks:
        text += chunk
        counts.append(count_tokens(text))
    return [max(0, b - a) for a, b in itertools.pairwise(counts)]


def token_gaps_ms(chunk_s: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """Inter-token latencies (ms) of one stream: each chunk after the first carrying ``k``
    tokens ``g`` ms after the previous one gives ``k`` latencies of ``g / k`` (a chunk whose text
    adds no whole token yet counts as one)."""
    out: list[float] = []
    for a, b, k in zip(chunk_s, chunk_s[1:], tokens[1:], strict=False):
        n = max(1, k)
        out += [(b - a) * 1000 / n] * n
    return out


def median_cells(cells: Sequence[Cell]) -> list[Cell]:
    """One cell per (target, concurrency): the median of each figure over the rounds."""
    groups: dict[tuple[str, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.target, c.concurrency), []).append(c)
    out = []
    for (target, conc), group in groups.items():
        values = {
            k: float(np.median([getattr(c, k) for c in group]))
            for k in asdict(group[0])
            if k not in ("target", "concurrency", "requests", "failures", "round")
        }
        out.append(
            Cell(
                target=target,
                concurrency=conc,
                requests=sum(c.requests for c in group),
                failures=sum(c.failures for c in group),
                round=len(group),
                **values,
            )
        )
    return out


def decode_tok_s(cell: Cell) -> float:
    return 1000.0 / cell.itl_p50_ms if cell.itl_p50_ms > 0 else float("nan")


def value(cell: Cell, field: str) -> float:
    return decode_tok_s(cell) if field == "decode_tok_s" else float(getattr(cell, field))


def chart(cells: Sequence[Cell], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({c.target for c in cells})
    concs = sorted({c.concurrency for c in cells})
    by = {(c.target, c.concurrency): c for c in cells}
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    panels = (
        ("decode_tok_s", "decode tok/s per stream"),
        ("tokens_per_s", "aggregate tok/s"),
        ("ttft_p50_ms", "TTFT p50 (ms)"),
    )
    width = 0.8 / max(1, len(labels))
    for ax, (name, title) in zip(axes, panels, strict=True):
        for i, label in enumerate(labels):
            xs = [j + i * width for j in range(len(concs))]
            ys = [value(by[label, c], name) if (label, c) in by else 0 for c in concs]
            ax.bar(xs, ys, width, label=label)
        ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(concs))])
        ax.set_xticklabels([f"{c} streams" for c in concs])
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
