"""The decoder export report's Markdown (the figures a reviewer reads); written by
:func:`export.report.write_report`."""

from __future__ import annotations

from typing import Any

from tritonforge.export.report import header_lines, timings_lines


def render_markdown(report: dict[str, Any]) -> str:
    parity, fid = report["parity"]["fp32"], report["fidelity"]
    lines = [
        *header_lines(report, "role"),
        "",
        "## Logits vs PyTorch (grid: batch x past x new, padded batches, cached decode steps)",
        "",
        f"{parity['cases']} cases; max abs {parity['max_abs']:.3g}; worst {parity['worst']['label']}"
        f" (ratio to atol {parity['atol']} + rtol {parity['rtol']}: {parity['worst']['ratio']:.3f})",
        "",
        "## Greedy fidelity (served scheduler vs PyTorch generate)",
        "",
        f"- {fid['identical']}/{fid['prompts']} prompts token-identical ({fid['tokens']} tokens)",
        f"- divergences (token index, PyTorch top-2 logit margin): {fid['divergences'] or 'none'}",
        "- batching invariance (alone vs in a batch of 8 mixed-length prompts): "
        f"{fid['batching_invariance_differences'] or 'identical'}",
    ]
    default = report.get("default")
    if default:
        lines += ["", "## Served", "", f"- {default['reason']}"]
        lines += [f"- {variant}: `{model}`" for variant, model in default["models"].items()]
    q = report.get("quantization")
    if q:
        lines += [
            "",
            "## int8",
            "",
            f"- {q['method']}",
            f"- greedy agreement with fp32 {q['greedy_agreement']:.3f} "
            f"(gate >= {q['gate']['min_greedy_agreement']})",
            f"- held-out perplexity fp32 {q['perplexity']['fp32']:.2f}, int8 "
            f"{q['perplexity']['int8']:.2f} (ratio {q['perplexity']['ratio']:.3f}, gate <= "
            f"{q['gate']['max_perplexity_ratio']})",
        ]
        task = q.get("factual_questions")
        if task and task["questions"]:
            lines.append(
                f"- factual questions right: fp32 {task['fp32']}, int8 {task['int8']} of "
                f"{task['questions']} (gate: at most {q['gate']['max_task_answers_lost']} fewer)"
            )
    lines += ["", "## Decode-step latency (ms, median)", ""]
    lines += [f"- {k}: {v:.1f}" for k, v in report["latency_ms"].items()]
    lines += timings_lines(report)
    return "\n".join(lines) + "\n"
