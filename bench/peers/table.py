"""The table of every server beside the limit, with ranges over rounds (make bench and make bench-peers)."""

from __future__ import annotations


def value_range(values: list[float], digits: int = 0) -> str:
    """`low-high` of the values (one value alone), `n/a` for none."""
    if not values:
        return "n/a"
    low, high = min(values), max(values)
    return f"{low:.{digits}f}" if f"{low:.{digits}f}" == f"{high:.{digits}f}" else f"{low:.{digits}f}-{high:.{digits}f}"


def servers_table(limits: list[float], rows: list[dict], concurrency: int = 16) -> list[str]:
    """Every server beside the limit: throughput at `concurrency` and the c=1 p50, each a range over rounds.

    `rows`: {"name", "images_per_s": [...], "p50_ms": [...], "setup"}; the ratio is to the limit's mean.
    """
    limit = sum(limits) / len(limits) if limits else 0.0
    lines = [
        f"| server | img/s at c={concurrency} | vs limit | p50 ms at c=1 | setup |",
        "|---|---|---|---|---|",
        f"| limit: in-process ONNX Runtime | {value_range(limits)} | 1.00x | | same .onnx, same cores, best layout |",
    ]
    for row in rows:
        ratios = [v / limit for v in row["images_per_s"]] if limit else []
        lines.append(
            f"| {row['name']} | {value_range(row['images_per_s'])} | "
            f"{value_range(ratios, 2) + 'x' if ratios else 'n/a'} | {value_range(row['p50_ms'], 1)} | {row['setup']} |"
        )
    return lines
