"""``training_report.md``: the training report's figures as tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

METRICS = ("accuracy", "macro_f1")


def _row(name: str, s: dict[str, Any], labels: list[str]) -> str:
    cells = [f"{s[m]:.4f}" for m in METRICS] + [f"{s['f1_per_class'][lab]:.4f}" for lab in labels]
    return f"| {name} | " + " | ".join(cells) + " |"


def render(report: dict[str, Any]) -> str:
    labels: list[str] = report["labels"]
    hp = report["hyper_parameters"]
    lines = [
        "# Default classifier: training report",
        "",
        f"Fingerprint `{report['fingerprint']['digest'][:16]}`; corpus {report['corpus']['package']} "
        f"`{report['corpus']['file']}`. {report['design']}",
        "",
        "## Test split (held out), per version",
        "",
    ]
    header = "| model | accuracy | macro-F1 | " + " | ".join(f"F1 {lab}" for lab in labels) + " |"
    for version, v in report["versions"].items():
        lines += [
            f"### v{version}: trained on `{v['train_rows']}` ({v['train_count']} rows), "
            f"best epoch {v['best_epoch']}",
            "",
            header,
            "|" + "---|" * (3 + len(labels)),
            _row("classifier (PyTorch, fp32)", v["test"], labels),
            _row(
                "linear probe on frozen mean-pooled embeddings (floor)",
                v["baselines"]["linear_probe_mean_pooled"],
                labels,
            ),
            _row("TF-IDF + logistic regression", v["baselines"]["tfidf_logreg"], labels),
            _row("majority class", v["baselines"]["majority"], labels),
            "",
            "Confusion matrix of the classifier (rows: true, columns: predicted, order "
            f"{', '.join(labels)}): `{v['test']['confusion_matrix']}`",
            "",
        ]
    c = report["corpus"]["cleaning"]
    lines += [
        "## Data",
        "",
        f"{c['rows_read']} rows read; dropped {c['empty_dropped']} empty, {c['duplicates_dropped']} "
        f"duplicates (same case-folded text and label), {c['conflicting_dropped']} rows whose "
        f"copies disagree on the label; {c['texts_with_mojibake']} texts had mojibake removed; "
        f"{c['rows_kept']} rows kept.",
        "",
        f"Split (stratified, seed {report['split']['seed']}):",
        "",
        "| split | " + " | ".join(labels) + " | total |",
        "|" + "---|" * (2 + len(labels)),
    ]
    for name, counts in report["split"]["counts"].items():
        lines.append(
            f"| {name} | "
            + " | ".join(str(counts[lab]) for lab in labels)
            + f" | {counts['total']} |"
        )
    t = report["tokens"]
    lines += [
        "",
        f"Tokens per text (after truncation to {t['max_length']}): {t['percentiles']}, mean "
        f"{t['mean']}; {t['truncated_rows']} texts were longer and truncated.",
        "",
        "## Hyper-parameters and timings",
        "",
        "`" + ", ".join(f"{k}={v}" for k, v in hp.items()) + "`",
        "",
        "Timings (s): `" + ", ".join(f"{k} {v}" for k, v in report["timings_s"].items()) + "`; "
        f"load average {report['machine']['load_average_1m_start']} -> "
        f"{report['machine']['load_average_1m_end']} on {report['machine']['cpus']} CPUs.",
        "",
    ]
    return "\n".join(lines)


def write_markdown(report: dict[str, Any], path: Path) -> None:
    path.write_text(render(report))
