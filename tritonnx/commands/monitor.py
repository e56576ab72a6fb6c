"""python -m tritonnx.commands.monitor: Prometheus next to a running `make serve`, with tritonnx's rules.

Scrapes Triton (:8002), the facade (:3000) and the supervisor (:8003) of `make serve` by default,
or the addresses given (several per kind for replicas), evaluates deploy/monitoring/rules.yml, and
runs until Ctrl-C. The Grafana dashboard (deploy/monitoring/grafana-dashboard.json) reads this
Prometheus: import it into a Grafana with this Prometheus as its data source.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritonnx.common.paths import Paths, checkout_root
from tritonnx.common.ports import FACADE_HTTP, SUPERVISOR_METRICS, TRITON_METRICS, local
from tritonnx.server.process import ServerError, StopRequest
from tritonnx.server.prometheus import PrometheusServer

MONITORING = (checkout_root() or Path.cwd()) / "deploy" / "monitoring"


def main(argv: list[str] | None = None) -> int:
    paths = Paths.from_environment()
    parser = argparse.ArgumentParser(
        prog="python -m tritonnx.commands.monitor",
        description="Run Prometheus (Debian's package) scraping tritonnx's servers, with its recording and "
        "alerting rules, until Ctrl-C.",
        epilog="Example, three replicas behind one facade: python -m tritonnx.commands.monitor --triton 127.0.0.1:8002 "
        "127.0.0.1:9002 127.0.0.1:10002 --supervisor 127.0.0.1:8003 127.0.0.1:9003 127.0.0.1:10003",
    )
    parser.add_argument("--triton", nargs="+", default=[local(TRITON_METRICS)], help="Triton metrics host:port; "
                        "default: %(default)s")  # fmt: skip
    parser.add_argument("--facade", nargs="*", default=[local(FACADE_HTTP)], help="facade HTTP host:port (none: "
                        "no facade); default: %(default)s")  # fmt: skip
    parser.add_argument("--supervisor", nargs="*", default=[local(SUPERVISOR_METRICS)], help="supervisor metrics "
                        "host:port (none: not scraped); default: %(default)s")  # fmt: skip
    parser.add_argument("--port", type=int, default=9090, help="Prometheus' port on 127.0.0.1; default: %(default)s")
    parser.add_argument("--interval", default="5s", help="scrape and rule interval; default: %(default)s")
    parser.add_argument("--rules", type=Path, default=MONITORING / "rules.yml", help="default: %(default)s")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=paths.build / "monitoring",
        help="prometheus.yml, its log and its data; default: %(default)s",
    )
    args = parser.parse_args(argv)
    prometheus = PrometheusServer(
        workdir=args.workdir,
        targets={"triton": args.triton, "facade": args.facade, "supervisor": args.supervisor},
        rule_files=[args.rules.resolve()],
        port=args.port,
        interval=args.interval,
    )
    stop = StopRequest()
    try:
        print(f"starting prometheus (config, log and data in {args.workdir}) ...", flush=True)
        prometheus.start()
        print(
            f"prometheus ready: {prometheus.url}\n"
            f"  targets  {prometheus.url}/targets   (up: Triton {', '.join(args.triton)}; facade "
            f"{', '.join(args.facade) or 'none'}; supervisor {', '.join(args.supervisor) or 'none'})\n"
            f"  alerts   {prometheus.url}/alerts    (rules: {args.rules})\n"
            f"  query    {prometheus.url}/graph?g0.expr=sum%20by%20(model)%20(rate(nv_inference_count[1m]))\n"
            f"  Grafana  import {MONITORING / 'grafana-dashboard.json'} with {prometheus.url} as its data source\n"
            "Ctrl-C stops it.",
            flush=True,
        )
        if not stop.wait(prometheus):
            print(f"error: prometheus exited on its own{prometheus.log_hint()}", file=sys.stderr)
            return 1
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        prometheus.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
