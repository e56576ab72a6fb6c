"""The campaign's gates, its report (a table of the attacks) and its results.json."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import grpc

from bench.attacks.calls import BESIDE, Call
from bench.attacks.campaign import AttackResult, Campaign, statuses
from bench.attacks.catalog import Outcome
from bench.attacks.watch import KINDS, ProbeSummary
from bench.output import Gate, gates_section, head, machine, settings
from tritonnx.client.facade.errors import FacadeError

ANSWER_S = 1.0  # every attack call answered within this
PROBE_SLACK_MS = 250.0  # the probe's slowest call during an attack, above its slowest before the attacks
RISE_MIB = 256.0  # the facade's peak RSS above its level before an attack
IDLE_RISE_MIB = 64.0  # RSS after the idle period above RSS at the start


def _codes(error: type[FacadeError]) -> set[str]:
    return {error.code.name}.union(*(_codes(sub) for sub in error.__subclasses__()))


# What the facade may answer: the statuses of errors.py, RESOURCE_EXHAUSTED from gRPC's own size check and
# UNAUTHENTICATED from the token check, UNAVAILABLE for a call whose connection the facade closed, and a raw HTTP/2
# stream's end or its connection's (abuse.py: ENDED, CLOSED); never INTERNAL (a model failure or a facade bug) or
# UNKNOWN (an exception gRPC caught).
DOCUMENTED = (_codes(FacadeError) | {"OK", "RESOURCE_EXHAUSTED", "UNAUTHENTICATED", "ENDED", "CLOSED"}) - {
    grpc.StatusCode.INTERNAL.name,
    grpc.StatusCode.UNKNOWN.name,
}


def undocumented(result: AttackResult) -> list[str]:
    return sorted({call.code for call in result.calls} - DOCUMENTED)


def slowest(calls: list[Call]) -> float:
    return max((call.seconds for call in calls), default=0.0)


def _probe_failures(result: AttackResult) -> int:
    return sum(summary.failed for summary in result.probe.values())


def _probe_over(result: AttackResult, baseline: dict[str, ProbeSummary], slack_ms: float) -> list[str]:
    return [
        f"{kind} {result.probe[kind].slowest_ms:,.0f} ms"
        for kind in KINDS
        if result.probe[kind].slowest_ms > baseline[kind].slowest_ms + slack_ms
    ]


def _gate(name: str, failed: dict[str, Any], said: Callable[[Any], str], otherwise: str) -> Gate:
    """Passed when nothing failed (attack -> what, as `said` says it); the detail names each failure, or `otherwise`."""
    return Gate(name, not failed, "; ".join(f"{attack}: {said(what)}" for attack, what in failed.items()) or otherwise)


def gates(campaign: Campaign, probe_slack_ms: float = PROBE_SLACK_MS, answer_s: float = ANSWER_S) -> list[Gate]:
    """The gates, at make chaos's bounds unless told wider ones (the CI step's, for a loaded machine)."""
    results, baseline = campaign.results, campaign.baseline
    odd = {r.name: undocumented(r) for r in results if undocumented(r)}
    late = {r.name: slowest(r.outcome.calls) for r in results if slowest(r.outcome.calls) > answer_s}
    probe_failed = {r.name: _probe_failures(r) for r in results if _probe_failures(r)}
    refused = {
        r.name: codes for r in results if (codes := [c.code for c in r.calls if c.caller == BESIDE and c.code != "OK"])
    }
    probe_slow = {r.name: over for r in results if (over := _probe_over(r, baseline, probe_slack_ms))}
    grew = {r.name: r.rss_rise_mib for r in results if r.rss_rise_mib >= RISE_MIB}
    before = ", ".join(f"{kind} {baseline[kind].slowest_ms:,.0f} ms" for kind in KINDS)
    judged = [
        _gate(
            "every attack call ended with a documented status (errors.py's, gRPC's size check's RESOURCE_EXHAUSTED, "
            "UNAUTHENTICATED; never INTERNAL or UNKNOWN)",
            odd,
            ", ".join,
            f"{len(results)} attacks",
        ),
        _gate(
            f"every attack call answered within {answer_s:g} s (calls held without their body, and the unread "
            "stream, end at the facade's body deadline or when the attacker stops)",
            late,
            "{:,.2f} s".format,
            f"slowest {max((slowest(r.outcome.calls) for r in results), default=0.0):.3f} s",
        ),
        _gate(
            "every legitimate call sent beside an attack from a connection of its own (a priority-1 Predict) was "
            "answered OK",
            refused,
            ", ".join,
            f"{sum(c.caller == BESIDE for r in results for c in r.calls)} calls",
        ),
        _gate(
            "the probe never failed during an attack",
            probe_failed,
            "{} failed".format,
            f"{sum(s.calls for r in results for s in r.probe.values())} probe calls",
        ),
        _gate(
            f"the probe's slowest call during each attack within {probe_slack_ms:g} ms of its slowest before them "
            f"({before})",
            probe_slow,
            ", ".join,
            f"{len(results)} attacks",
        ),
        _gate(
            f"the facade's peak RSS rose less than {RISE_MIB:g} MiB in every attack",
            grew,
            "+{:,.0f} MiB".format,
            f"largest +{max((r.rss_rise_mib for r in results), default=0.0):,.0f} MiB",
        ),
        _gate(
            "the facades stayed up through every attack",
            {campaign.exited: "the campaign stopped there"} if campaign.exited else {},
            str,
            f"{len(results)} attacks",
        ),
    ]
    if campaign.idle_seconds > 0 and not campaign.exited:
        rise = campaign.rss_after_idle_mib - campaign.rss_start_mib
        judged.append(
            Gate(
                f"the facade's RSS within {IDLE_RISE_MIB:g} MiB of its start after {campaign.idle_seconds:g} s idle",
                rise <= IDLE_RISE_MIB,
                f"{campaign.rss_start_mib:,.0f} MiB at the start, {campaign.rss_after_idle_mib:,.0f} MiB after",
            )
        )
    return judged


def _statuses(result: AttackResult) -> str:
    answered = ", ".join(f"{code} {count:,}" for code, count in statuses(result.outcome.calls).items())
    held = ", ".join(f"{code} {count:,}" for code, count in statuses(result.outcome.held).items())
    ended = f" after {slowest(result.outcome.held):,.1f} s" if held else ""
    return "; ".join(filter(None, [answered, f"held: {held}{ended}" if held else ""]))


def _probe(result: AttackResult) -> str:
    parts = []
    for kind in KINDS:
        summary = result.probe[kind]
        failures = ", ".join(f"{status} {count}" for status, count in summary.failures.items())
        failed = f"{summary.failed} of {summary.calls} failed" + (f" ({failures})" if failures else "")
        parts.append(f"{kind} {failed}, slowest {summary.slowest_ms:,.0f} ms")
    return "; ".join(parts)


def _sent(outcome: Outcome) -> str:
    return (
        f"{outcome.count:,} x {outcome.body_bytes / 1e6:,.1f} MB"
        if outcome.body_bytes
        else f"{outcome.count:,}, headers only"
    )


def report(campaign: Campaign, judged: list[Gate], quick: bool) -> str:
    rows = [
        f"| `{r.name}`: {r.attack.what} | {_sent(r.outcome)} | {_statuses(r)} | "
        f"{f'{slowest(r.outcome.calls) * 1000:,.0f} ms' if r.outcome.calls else '-'} | {_probe(r)} | "
        f"{round(r.rss_rise_mib):+,d} MiB |"
        for r in campaign.results
    ]
    notes = [f"- `{r.name}`: {note}" for r in campaign.results for note in [*r.outcome.notes, *r.guarded]]
    base = campaign.baseline
    return "\n".join(
        [
            f"# Attacks on the facade{' (quick)' if quick else ''}",
            "",
            f"The facade ran with its defaults (message limit {campaign.limit:,} bytes"
            f"{'; a bearer token, which the attackers held too' if campaign.token else ''}), in front of tritonserver "
            "serving resnet50, mobilenet_v3_small and its image pipeline. A probe sent a "
            "valid mobilenet_v3_small Predict (at priority 1, which the facade's last slots are kept for) and a GET of /metrics every 0.5 s, each with a 2 s limit; before the "
            f"attacks their slowest calls took {base['Predict'].slowest_ms:,.0f} ms and "
            f"{base['/metrics'].slowest_ms:,.0f} ms ({base['Predict'].calls} and {base['/metrics'].calls} calls). Each "
            "attack's phase lasts until the facade holds no call, and a second more; its RSS rise is its peak (samples "
            'every 50 ms and the kernel\'s high-water mark) above its RSS before the attack. A status "by the attacker" '
            'is a call the attacker cancelled or that reached the attacker\'s own deadline; "held": calls without '
            "their whole body (or the unread stream), which the facade ends at its body deadline or the attacker stops.",
            "",
            *head("attack | sent | statuses | slowest answer | probe during it | facade peak RSS rise"),
            *rows,
            "",
            f"Facade RSS: {campaign.rss_start_mib:,.0f} MiB at the start, "
            + (
                f"{campaign.rss_after_idle_mib:,.0f} MiB after {campaign.idle_seconds:g} s idle after the last attack."
                if not campaign.exited
                else f"not measured after: a facade exited during `{campaign.exited}`."
            ),
            "",
            *(["## Notes", "", *notes, ""] if notes else []),
            gates_section(judged),
        ]
    )


def _attack(r: AttackResult) -> dict:
    found = {"name": r.name, "what": r.attack.what, **asdict(r), **asdict(r.outcome)}
    del found["attack"], found["outcome"], found["held"]
    return found | {
        "calls": [asdict(call) for call in r.calls],  # answered, then held
        "rss_rise_mib": round(r.rss_rise_mib, 1),
    }


def results(campaign: Campaign, args: argparse.Namespace) -> dict:
    """What results.json keeps (finish adds the gates)."""
    found = asdict(replace(campaign, results=[]))
    found["rss_after_idle_mib"] = None if campaign.exited else round(campaign.rss_after_idle_mib, 1)
    found["attacks"] = [_attack(r) for r in campaign.results]
    del found["results"]
    return {"settings": settings(args), "machine": machine(), **found}
