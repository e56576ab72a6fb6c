"""The campaign: the attacks one after the other against a facade of its defaults, watched throughout."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import REPOSITORY
from bench.attacks.abuse import every_attack
from bench.attacks.calls import FACADE, Call, channel, one
from bench.attacks.catalog import QUICK, TOKEN, Attack, Context, Outcome, Sizes, holding, until
from bench.attacks.payloads import valid_predict
from bench.attacks.watch import PROBE_LIMIT_S, ProbeSummary, Target, Watch, rss_mib
from bench.output import say
from tritonnx.server.facade import start_facade
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

# The facade's default model answers its health probes; mobilenet_v3_small is the one attacked and probed, and
# Classify's bombs go to its image pipeline.
SERVED = ("resnet50", "mobilenet_v3_small", "image_preprocess", "mobilenet_v3_small_image")
IDLE_TIMEOUT_S = 60.0  # the longest wait for the facade to finish with an attack
TAIL_S = 1.0  # each attack's phase goes on this long after the facade is idle (and until the probe called in it)


@dataclass
class AttackResult:
    attack: Attack
    outcome: Outcome
    seconds: float
    probe: dict[str, ProbeSummary]  # by kind of probe call, during the attack
    rss_before_mib: float
    rss_peak_mib: float
    guarded: list[str]  # why the memory guard stopped it, if it did

    @property
    def name(self) -> str:
        return self.attack.name

    @property
    def calls(self) -> list[Call]:
        """Every call the attack ended: those answered, then those held without their whole body."""
        return self.outcome.calls + self.outcome.held

    @property
    def rss_rise_mib(self) -> float:
        return self.rss_peak_mib - self.rss_before_mib


@dataclass
class Campaign:
    limit: int
    rss_start_mib: float
    rss_after_idle_mib: float
    idle_seconds: float
    baseline: dict[str, ProbeSummary]
    results: list[AttackResult]
    guarded: list[str]
    exited: str  # the attack during which a facade exited (the campaign stopped there); "": none did
    token: bool = False  # the facade needed a bearer token, which the attackers held too


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
    guarded = [g for g in watch.guarded if g.startswith(attack.name + ":")]
    result = AttackResult(
        attack, outcome, seconds, watch.probed(attack.name), before, watch.peak_mib(attack.name), guarded
    )
    watch.enter("between")
    slowest = max((c.seconds for c in outcome.calls), default=0)
    say(f"{attack.name}: {statuses(result.calls)}, slowest {slowest:.2f} s, peak {round(result.rss_rise_mib):+,d} MiB")
    return result


def statuses(calls: list[Call]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for call in calls:
        label = call.code if call.ended_by == FACADE else f"{call.code} by the attacker"
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items()))


def message_limit() -> int:
    """The facade's --max-message-bytes, as its --help states it (its default, or the environment's)."""
    command = [sys.executable, "-m", "tritonnx.client.facade", "--help"]  # as the stack starts it: same cwd and env
    text = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    found = re.search(r"^\s+--max-message-bytes\b.*?default: (\d+)", text, re.MULTILINE | re.DOTALL)
    if found is None:
        raise RuntimeError("the facade's --help states no --max-message-bytes default")
    return int(found[1])


def run(args: argparse.Namespace, out: Path) -> Campaign:
    """Serve the models on free ports with a facade of its defaults, and attack it with each chosen attack in turn."""
    sizes, quick = QUICK if args.quick else Sizes(), args.quick
    repository = link_models(out / "repository", {name: REPOSITORY / name for name in SERVED})
    token = (("authorization", f"Bearer {TOKEN}"),) if args.token else ()
    with ServingStack(repository, out, facade_args=["--auth-token", TOKEN] if args.token else []) as stack:
        facade = stack.facade
        assert facade is not None
        main = Target(facade.grpc_url, facade.http_url, facade.pid, token)
        limit = message_limit()
        say(f"facade {main.grpc_url}: its message limit {limit:,} bytes")
        _warm(main)
        results = []
        with Watch(main, args.rss_cap_mib, args.available_floor_mib) as watch:
            until(lambda: watch.answered("Predict") and watch.answered("/metrics"), 30)
            watch.enter("baseline")
            time.sleep(sizes.baseline_seconds)
            baseline = watch.probed("baseline")
            rss_start = watch.rss_now()
            exited = ""
            for attack in (a for a in every_attack() if a.name in args.attacks):
                if not attack.facade_args:
                    ctx = Context(main, limit, sizes, quick, watch.guard)
                    results.append(attack_once(attack, ctx, watch))
                else:
                    log = out / f"facade-{attack.name}.log"
                    own = start_facade(stack.triton.grpc_url, stack.admin_key, log, list(attack.facade_args))
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
                say(f"idle for {args.idle_seconds:g} s ...")
                time.sleep(args.idle_seconds)
                rss_after = watch.rss_now()
        return Campaign(
            limit, rss_start, rss_after, args.idle_seconds, baseline, results, watch.guarded, exited, args.token
        )
