"""The table primitives every suite's renderer uses: a Markdown (or plain) table and the line that states the run.

They live apart from ``tables.py``, which renders every suite's file and so imports the suites' own renderers;
a suite that imported ``tables`` back would make a cycle.
"""

from __future__ import annotations


def table(columns: list[str], rows: list[list], markdown: bool = True) -> str:
    """A Markdown table, or the same cells as aligned plain text.

    Example:
        >>> print(table(["a", "b"], [[1, 2]]))
        | a | b |
        |---|---|
        | 1 | 2 |
    """
    if markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])
    widths = [max(len(str(x)) for x in col) for col in zip(columns, *rows)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [columns, *rows])


def stated(header: dict, markdown: bool = True) -> str:
    """The line every table starts with: model, data, split, n, date, machine; then the command."""
    keep = ("model", "data", "split", "n", "date", "machine", "lm_threads")
    line = "; ".join(f"{k}: {header[k]}" for k in keep if k in header)
    cmd = header.get("command", "")
    return (f"*{line}*\n\n`{cmd}`" if markdown else f"{line}\n{cmd}")


def targets_lines(targets: list[dict], markdown: bool = True) -> list[str]:
    """"Targets:" and their table, a ``model`` column where they name one; nothing without targets."""
    if not targets:
        return []
    columns = [c for c in ("model", "target", "measured") if c in targets[0]]
    rows = [[t[c] for c in columns] + [{True: "met", False: "NOT met", None: "not measured"}[t["met"]]] for t in targets]
    return titled("Targets:", [*columns, "verdict"], rows, markdown)


def titled(title: str, columns: list[str], rows: list[list], markdown: bool = True) -> list[str]:
    """A table below other output: a blank line, ``title``, a blank line, the table."""
    return ["", title, "", table(columns, rows, markdown)]
