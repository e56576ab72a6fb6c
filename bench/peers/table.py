"""Every server beside the limit, as `make bench` and `make bench-peers` report it: ranges over rounds.

`servers` maps a server's name to `{"setup": ..., "rounds": [record, ...]}`, a record being `servers.closed_loop`'s.
"""

from __future__ import annotations


def value_range(values: list[float], digits: int = 0) -> str:
    """`low-high` of the values (one value alone), `n/a` for none."""
    if not values:
        return "n/a"
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def counted(points: list[dict]) -> list[dict]:
    """The points whose figure counts: no errors, and (a FastAPI run) its load spread over the workers."""
    return [p for p in points if not p["errors"] and p.get("worker_cpu", {}).get("spread") is not False]


def table_rows(servers: dict, concurrency: int) -> list[dict]:
    """One row per server: its counted figures at `concurrency` and its c=1 p50s, over the rounds."""
    rows = []
    for name, server in servers.items():
        points = counted([p for record in server["rounds"] for p in record.get("points", [])])
        rows.append({
            "name": name,
            "images_per_s": [p["images_per_s"] for p in points if p["concurrency"] == concurrency],
            "p50_ms": [p["p50_ms"] for p in points if p["concurrency"] == 1],
            "setup": server["setup"],
        })  # fmt: skip
    return rows


def servers_table(limits: list[float], rows: list[dict], concurrency: int = 16) -> list[str]:
    """Every server beside the limit: throughput at `concurrency` and the c=1 p50; the ratio is to the limit's mean."""
    limit = sum(limits) / len(limits) if limits else 0.0
    lines = [
        f"| server | img/s at c={concurrency} | vs limit | p50 ms at c=1 | setup |",
        "|---|---|---|---|---|",
        f"| limit: in-process ONNX Runtime | {value_range(limits)} | 1.00x | | same .onnx, same cores, best layout |",
    ]
    for row in rows:
        ratios = (
            value_range([v / limit for v in row["images_per_s"]], 2) + "x" if limit and row["images_per_s"] else "n/a"
        )
        lines.append(
            f"| {row['name']} | {value_range(row['images_per_s'])} | {ratios} | {value_range(row['p50_ms'], 1)} | "
            f"{row['setup']} |"
        )
    return lines


def notes(servers: dict) -> list[str]:
    """The rounds a server was not measured in, and FastAPI's CPU split over its workers in each run."""
    rounds = [(name, index + 1, record) for name, s in servers.items() for index, record in enumerate(s["rounds"])]
    problems = [f"- {name}, round {n}: {record['error']}" for name, n, record in rounds if "error" in record]
    splits = [
        f"- {name}, round {n}, c={p['concurrency']}: "
        + " / ".join(f"{share:.0%}" for share in p["worker_cpu"]["shares"])
        + ("" if p["worker_cpu"]["spread"] is not False else " (not spread: not counted)")
        for name, n, record in rounds
        for p in record.get("points", [])
        if len(p.get("worker_cpu", {}).get("shares", [])) > 1
    ]
    lines = ["Not measured:", "", *problems, ""] if problems else []
    if splits:
        lines += [
            "FastAPI's CPU per worker process (share of the workers' CPU) in each run: a run counts only if every "
            "worker did at least half of an even share; one that did not is run once more with new connections.",
            "",
            *splits,
            "",
        ]
    return lines
