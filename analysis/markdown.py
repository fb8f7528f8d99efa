"""GitHub-flavoured Markdown tables, as every report and command prints them."""

from __future__ import annotations

from analysis.verdict import fmt


def md_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub-flavoured Markdown table."""
    def cell(v) -> str:
        return fmt(v) if isinstance(v, float) else str(v).replace("|", "\\|")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
