"""Render evaluation reports: console table, Markdown and JSON."""

from __future__ import annotations

import json


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def averaged_over(report) -> str:
    """Which tasks the average covers, so an average over fewer tasks is never mistaken for the suite's: every
    task left out of the mean is named with its reason (its data not found, or its Spearman undefined)."""
    n = sum(t.spearman is not None for t in report.tasks)
    total = len(report.tasks) + len(report.missing_tasks)
    reasons: dict[str, list[str]] = {}
    if report.missing_tasks:
        reasons["not found under --data"] = list(report.missing_tasks)
    for t in report.tasks:
        if t.spearman is None:
            reasons.setdefault(t.undefined or "Spearman undefined", []).append(t.name)
    left = ", ".join(f"{', '.join(names)} ({why})" for why, names in reasons.items())
    out = f"; left out: {left}" if left else ""
    # a scores file may cover part of a task: its Spearman is over those pairs only, and the mean says so
    partial = [f"{t.name} {t.scored} of {t.n} pairs" for t in report.tasks if t.spearman is not None and t.scored < t.n]
    part = f"; in part: {', '.join(partial)}" if partial else ""
    return f"mean of {n} of {total} tasks{out}{part}"


def format_table(report) -> str:
    """A fixed-width console table, one row per task, then the average."""
    info = report.scorer
    head = f"model: {info.get('model')}  pooling: {info.get('pooling')}  data: {report.data_hash}"
    rows = [("task", "pairs", "scored", "Spearman", "Pearson", "note")]
    for t in report.tasks:
        rows.append((t.name, str(t.n), str(t.scored), _fmt(t.spearman), _fmt(t.pearson), t.note))
    rows.append(("Avg.", "", "", _fmt(report.average), "", f"Spearman x100, 'all' setting; {averaged_over(report)}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [head]
    for j, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, 5)] + [r[5]]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * len(r[5]))  # the note column too
    if report.missing_tasks:
        lines.append(f"not found under --data (skipped): {', '.join(report.missing_tasks)}")
    return "\n".join(lines)


def to_markdown(report, title: str | None = None) -> str:
    info = report.scorer
    out = []
    if title:
        out += [f"## {title}", ""]
    out += [
        f"- model: `{info.get('model')}`",
        f"- kind: {info.get('kind')}; pooling: {info.get('pooling')}",
        f"- data hash: `{report.data_hash}`; metric: Spearman x100 over all pairs of a task pooled, Pearson x100",
        "",
        "| task | pairs | Spearman | Pearson | data hash | note |",
        "|---|---:|---:|---:|---|---|",
    ]
    for t in report.tasks:
        out.append(f"| {t.name} | {t.scored}/{t.n} | {_fmt(t.spearman)} | {_fmt(t.pearson)} | `{t.data_hash}` "
                   f"| {t.note} |")
    out.append(f"| **Avg.** | | **{_fmt(report.average)}** | | | {averaged_over(report)} |")
    if report.missing_tasks:
        out += ["", f"Not evaluated (data not found): {', '.join(report.missing_tasks)}."]
    return "\n".join(out) + "\n"


def suite_markdown(reports: list[tuple[str, object]]) -> str:
    """One row per model, one column per task: the paper's table layout.

    A task that a scorer covered only in part (a scored-pair file that holds some of its pairs,
    or a teacher that left pairs unscored) shows `score (scored/pairs)`: a Spearman over 256 of
    3,108 pairs is not the task's score, and a bare number beside full-task rows would read as one.
    """
    names: list[str] = []
    for _, rep in reports:
        for t in rep.tasks:
            if t.name not in names:
                names.append(t.name)
    out = ["| model | " + " | ".join(names) + " | Avg. |", "|---|" + "---:|" * (len(names) + 1)]
    any_partial = False
    for label, rep in reports:
        by = {t.name: t for t in rep.tasks}
        cells = [_suite_cell(by[n]) if n in by else "-" for n in names]
        partial = any(t.scored < t.n for t in rep.tasks)
        any_partial |= partial
        out.append(f"| {label} | " + " | ".join(cells) + f" | {_fmt(rep.average)}{' †' if partial else ''} |")
    text = "\n".join(out) + "\n"
    if any_partial:
        text += ("\n(k/n): Spearman over the k of the task's n pairs that were scored. "
                 "† averages tasks scored in part.\n")
    return text


def _suite_cell(task) -> str:
    if task.scored < task.n:
        return f"{_fmt(task.spearman)} ({task.scored:,}/{task.n:,})"
    return _fmt(task.spearman)


def to_json(report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)
