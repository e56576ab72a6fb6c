"""The campaign: the attacks one after the other against a facade of its defaults, watched throughout.

The runner waits for the facade to be idle before each attack, tags the probe and the memory with the attack's name
while it runs and until the facade is idle again, and records its calls.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import REPOSITORY
from bench.attacks.calls import FACADE, Call, channel, one
from bench.attacks.catalog import Attack, Context, Sizes, attacks, holding, until
from bench.attacks.payloads import valid_predict
from bench.attacks.watch import PROBE_LIMIT_S, ProbeSummary, Target, Watch, rss_mib
from bench.output import say
from tritonnx.server.facade import start_facade
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

# The facade's default model answers its health probes; mobilenet_v3_small is the one attacked and probed.
SERVED = ("resnet50", "mobilenet_v3_small")
IDLE_TIMEOUT_S = 60.0  # the longest wait for the facade to finish with an attack
TAIL_S = 1.0  # each attack's phase goes on this long after the facade is idle (and until the probe called in it)


@dataclass
class AttackResult:
    name: str
    what: str
    count: int
    body_bytes: int
    seconds: float
    calls: list[Call]
    held: list[Call]
    notes: list[str]
    probe: dict[str, ProbeSummary]
    rss_before_mib: float
    rss_peak_mib: float
    guarded: list[str]
    overload: bool = False  # Attack.overload: the probe's latency is not judged

    @property
    def rss_rise_mib(self) -> float:
        return self.rss_peak_mib - self.rss_before_mib


@dataclass
class Campaign:
    facade_source: str
    limit: int
    rss_start_mib: float
    rss_after_idle_mib: float
    idle_seconds: float
    baseline: dict[str, ProbeSummary]
    results: list[AttackResult]
    guarded: list[str]
    samples: list[tuple[float, float]]  # (seconds, RSS MiB) of the campaign's facade
    exited: str  # the attack during which a facade exited (the campaign stopped there); "": none did


def _settle(target: Target) -> None:
    """Until the facade holds no call (bounded: a facade that never gets there is reported as it is)."""
    until(lambda: holding(target) == 0, IDLE_TIMEOUT_S)


def _warm(target: Target) -> None:
    with channel(target.grpc_url) as chan:
        for _ in range(3):
            call = one(chan, valid_predict(), 30, target.metadata)
            if call.code != "OK":
                raise RuntimeError(f"the facade at {target.grpc_url} did not answer a valid Predict: {call.code}")


def attack_once(attack: Attack, ctx: Context, watch: Watch) -> AttackResult:
    _settle(ctx.target)
    before = rss_mib(ctx.target.pid)
    watch.enter(attack.name, ctx.target)
    say(f"{attack.name}: {attack.what} ...")
    started = time.monotonic()
    outcome = attack.run(ctx)
    seconds = time.monotonic() - started
    _settle(ctx.target)
    time.sleep(TAIL_S)
    until(lambda: all(summary.calls for summary in watch.probed(attack.name).values()), 2 * PROBE_LIMIT_S + 1)
    result = AttackResult(
        attack.name,
        attack.what,
        outcome.count,
        outcome.body_bytes,
        seconds,
        outcome.calls,
        outcome.held,
        outcome.notes,
        watch.probed(attack.name),
        before,
        watch.peak_mib(attack.name),
        [g for g in watch.guarded if g.startswith(attack.name + ":")],
        attack.overload,
    )
    watch.enter("between")
    say(
        f"{attack.name}: {statuses(outcome.calls + outcome.held)}, slowest answer "
        f"{max((c.seconds for c in outcome.calls), default=0):.2f} s, facade peak {round(result.rss_rise_mib):+,d} MiB"
    )
    return result


def statuses(calls: list[Call]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for call in calls:
        label = call.code if call.ended_by == FACADE else f"{call.code} by the attacker"
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items()))


def message_limit() -> int:
    """The facade's --max-message-bytes, as its --help states it (its default, or the environment's)."""
    command = [
        sys.executable,
        "-m",
        "tritonnx.client.facade",
        "--help",
    ]  # as the stack starts it: same cwd, same environment
    text = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    found = re.search(r"^\s+--max-message-bytes\b.*?default: (\d+)", text, re.MULTILINE | re.DOTALL)
    if found is None:
        raise RuntimeError("the facade's --help states no --max-message-bytes default: give --max-message-bytes")
    return int(found[1])


def facade_source(pid: int) -> str:
    """The folder of the code the facade runs: its package as imported from the facade's working directory."""
    command = [sys.executable, "-c", "import tritonnx.client.facade; print(tritonnx.client.facade.__file__)"]
    cwd = os.readlink(f"/proc/{pid}/cwd")
    found = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, check=True).stdout
    return str(Path(found.strip()).parent)


@dataclass(frozen=True)
class Options:
    attacks: list[str]
    sizes: Sizes
    limit: int | None  # the facade's message limit; None: read from its --help
    idle_seconds: float
    quick: bool
    rss_cap_mib: float
    available_floor_mib: float


def run(options: Options, out: Path) -> Campaign:
    """Serve the models on free ports with a facade of its defaults, and attack it with each chosen attack in turn."""
    sizes, quick = options.sizes, options.quick
    repository = link_models(out / "repository", {name: REPOSITORY / name for name in SERVED})
    with ServingStack(repository, out) as stack:
        facade = stack.facade
        assert facade is not None
        main = Target(facade.grpc_url, facade.http_url, facade.pid)
        source = facade_source(facade.pid)
        limit = options.limit or message_limit()
        say(f"facade {main.grpc_url} runs {source}; its message limit {limit:,} bytes")
        _warm(main)
        results = []
        with Watch(main, options.rss_cap_mib, options.available_floor_mib) as watch:
            until(lambda: watch.answered("Predict") and watch.answered("/metrics"), 30)
            watch.enter("baseline")
            time.sleep(sizes.baseline_seconds)
            baseline = watch.probed("baseline")
            rss_start = watch.rss_now()
            exited = ""
            for attack in (a for a in attacks() if a.name in options.attacks):
                if not attack.facade_args:
                    ctx = Context(main, limit, sizes, quick, watch.guard)
                    results.append(attack_once(attack, ctx, watch))
                else:
                    own = start_facade(
                        stack.triton.grpc_url,
                        stack.admin_key,
                        out / f"facade-{attack.name}.log",
                        list(attack.facade_args),
                    )
                    try:
                        target = Target(own.grpc_url, own.http_url, own.pid, attack.metadata)
                        _warm(target)
                        results.append(attack_once(attack, Context(target, limit, sizes, quick, watch.guard), watch))
                        exited = "" if target.alive() else attack.name
                    finally:
                        watch.enter("between", main)
                        own.stop()
                if exited or not main.alive():
                    exited = attack.name
                    say(f"a facade exited during {attack.name}: the campaign stops")
                    break
            rss_after = float("nan")
            if not exited:
                watch.enter("idle", main)
                say(f"idle for {options.idle_seconds:g} s ...")
                time.sleep(options.idle_seconds)
                rss_after = watch.rss_now()
            samples = [(round(s.seconds, 2), round(s.rss_mib, 1)) for s in watch.samples if s.pid == main.pid]
        return Campaign(
            source, limit, rss_start, rss_after, options.idle_seconds, baseline, results, watch.guarded, samples, exited
        )
