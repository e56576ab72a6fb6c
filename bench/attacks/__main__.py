"""The command line of the attack campaign (see bench/attacks/__init__.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.attacks.abuse import NAMES
from bench.attacks.campaign import run
from bench.attacks.report import ANSWER_S, PROBE_SLACK_MS, gates, report, results
from bench.output import finish, run_folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attacks",
        description="Attack a facade of its default settings (its own tritonserver on free loopback ports) with "
        "single crafted requests, each as measured by hand and again at the message limit, while a probe checks "
        "that others are still served; report what each attack got and cost, and judge it.",
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="small sizes and no idle period: a smoke run")
    add("--token", action="store_true", help="the facade needs a bearer token, and the attackers hold it too")
    add("--attacks", nargs="+", choices=NAMES, default=NAMES, metavar="NAME", help=f"{', '.join(NAMES)}")
    add("--idle-seconds", type=float, help="after the last attack, before RSS is judged; default: 60, --quick: 0")
    add("--rss-cap-mib", type=float, default=6144, help="an attack stops above this facade RSS; default: %(default)s")
    add("--available-floor-mib", type=float, default=2048, help="or below this memory left; default: %(default)s")
    add("--probe-slack-ms", type=float, default=PROBE_SLACK_MS, help="the probe gate's slack; default: %(default)s")
    add("--answer-seconds", type=float, default=ANSWER_S, help="the attack calls' answer gate; default: %(default)s")
    add("--out", type=Path, help="default: bench/results/<UTC timestamp>-attacks")
    args = parser.parse_args(argv)
    if args.idle_seconds is None:
        args.idle_seconds = 0.0 if args.quick else 60.0
    _, out = run_folder(args.out, "attacks")
    campaign = run(args, out)
    judged = gates(campaign, args.probe_slack_ms, args.answer_seconds)
    return finish(out, report(campaign, judged, args.quick), judged, results(campaign, args))


if __name__ == "__main__":
    sys.exit(main())
