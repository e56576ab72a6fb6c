"""Prometheus as a child process, scraping tritonnx's servers (`make monitor`, the tests), and one reader of a /metrics page.

The binary is Debian's `prometheus` package (`make apt` installs it; promtool comes with it). The
scrape configuration is made here from the servers' addresses, with one job per kind of server,
so the dashboard's and rules' queries find them by `job`:

    triton      Triton's metrics (port 8002): throughput, queue and compute time, pending requests
    facade      the facade's /metrics (port 3000): latency histograms, rejections, in flight
    supervisor  the supervisor's /metrics (port 8003): models healed, server restarts, models ready
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tritonnx.server.process import ManagedProcess, ServerError

JOBS = ("triton", "facade", "supervisor")


@dataclass(frozen=True)
class MetricsPage:
    """A Prometheus text page (Triton's :8002, the facade's and the supervisor's /metrics), parsed."""

    samples: tuple[tuple[str, dict[str, str], float], ...]  # (name, labels, value)

    @classmethod
    def parse(cls, text: str) -> MetricsPage:
        return cls(
            tuple(
                (sample.name, dict(sample.labels), float(sample.value))
                for family in text_string_to_metric_families(text)
                for sample in family.samples
            )
        )

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named `name` whose labels include `labels`; 0 when there are none yet."""
        return sum(
            value
            for sample, have, value in self.samples
            if sample == name and all(have.get(key) == wanted for key, wanted in labels.items())
        )

    def buckets(self, name: str, **labels: str) -> dict[float, float]:
        """A histogram's cumulative counts by upper bound (`le`), summed over the label sets that include `labels`."""
        counts: dict[float, float] = {}
        for sample, have, value in self.samples:
            if sample == f"{name}_bucket" and all(have.get(key) == wanted for key, wanted in labels.items()):
                bound = float(have["le"])
                counts[bound] = counts.get(bound, 0.0) + value
        return dict(sorted(counts.items()))


def bucket_quantile(counts: dict[float, float], quantile: float) -> float:
    """The upper bound of the bucket holding the `quantile` (0-1) of a histogram's cumulative `counts`; NaN if empty.

    A bound, not an estimate inside the bucket: the figure it gives is never below the true quantile.
    """
    total = max(counts.values(), default=0.0)
    if total == 0:
        return float("nan")
    return next(bound for bound, count in sorted(counts.items()) if count >= quantile * total)


def scrape(url: str, timeout: float = 5.0) -> MetricsPage:
    """GET a /metrics page (`url` is the page's whole address) and parse it."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return MetricsPage.parse(response.read().decode())


def find_binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ServerError(f"{name} not found: `make apt` installs Debian's prometheus package, which has it")
    return found


def scrape_config(targets: dict[str, list[str]], rule_files: list[Path], interval: str = "5s") -> str:
    """prometheus.yml for these host:port targets by job (JSON, which is YAML)."""
    unknown = set(targets) - set(JOBS)
    if unknown:
        raise ValueError(f"unknown jobs {sorted(unknown)}; known: {', '.join(JOBS)}")
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": addresses}]}
            for job, addresses in targets.items()
            if addresses
        ],
    }
    return json.dumps(config, indent=2) + "\n"


def promtool(*args: str) -> subprocess.CompletedProcess:
    """`promtool args...`; ServerError with its output when it fails."""
    done = subprocess.run([find_binary("promtool"), *args], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise ServerError(f"promtool {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done


@dataclass
class PrometheusServer(ManagedProcess):
    """Prometheus on host:port with its configuration and data in `workdir`."""

    workdir: Path = Path("build/monitoring")
    targets: dict[str, list[str]] = field(default_factory=dict)
    rule_files: list[Path] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 9090
    interval: str = "5s"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(scrape_config(self.targets, self.rule_files, self.interval))
        promtool("check", "config", str(config))  # the rules too: a bad file stops here, with the reason
        self.log_file = self.log_file or self.workdir / "prometheus.log"
        self.spawn(
            [
                find_binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address={self.host}:{self.port}",
                "--storage.tsdb.retention.time=1d",
            ]
        )
        self.wait_until(self._ready, "prometheus", timeout)

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
            return response.status == 200

    def api(self, path: str, **params: str) -> dict | list:
        """GET /api/v1/<path>; the `data` of a successful answer."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            answer = json.loads(response.read())
        if answer.get("status") != "success":
            raise ServerError(f"prometheus /api/v1/{path}: {answer}")
        return answer["data"]

    def query(self, promql: str) -> list[dict]:
        """An instant query's result: one {metric, value} per series."""
        data = self.api("query", query=promql)
        assert isinstance(data, dict)
        return data["result"]
