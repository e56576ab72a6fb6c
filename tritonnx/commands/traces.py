"""python -m tritonnx.commands.traces: an OTLP/HTTP trace receiver that prints each trace as a tree.

For looking at the stack's traces without a collector: `make serve SERVE_ARGS="--otlp-endpoint
http://127.0.0.1:4318"` next to `python -m tritonnx.commands.traces`, and every traced call shows up as the
facade's spans with tritonserver's under them. It takes what tritonserver and the facade send:
OTLP/HTTP with the JSON encoding, POST /v1/traces (gzip or not). In production, point the
endpoint at an OpenTelemetry Collector, Jaeger or Tempo instead, which take the same.

The tests start `OtlpReceiver` on a free port and read the spans it received.
"""

from __future__ import annotations

import argparse
import gzip
import json
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

TRACES_PATH = "/v1/traces"
# What the receiver keeps at most (the oldest traces go first): it is a viewer, not a store.
MAX_SPANS = 200_000
_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str  # "" for a trace's root
    name: str
    service: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[str, ...] = ()
    status: int = 0  # 0 unset, 1 ok, 2 error
    status_message: str = ""

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(any_value: dict) -> Any:
    """An OTLP JSON AnyValue as Python."""
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in any_value:
            return any_value[key]
    if "intValue" in any_value:
        return int(any_value["intValue"])
    if "arrayValue" in any_value:
        return [_value(v) for v in any_value["arrayValue"].get("values", [])]
    return None


def _attributes(items: list[dict] | None) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value", {})) for item in items or []}


def parse_export(body: dict) -> list[ReceivedSpan]:
    """The spans of an OTLP ExportTraceServiceRequest in the JSON encoding."""
    spans = []
    for resource_spans in body.get("resourceSpans", []):
        resource = _attributes(resource_spans.get("resource", {}).get("attributes"))
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                status = span.get("status", {})
                spans.append(
                    ReceivedSpan(
                        trace_id=span["traceId"].lower(),
                        span_id=span["spanId"].lower(),
                        parent_id=span.get("parentSpanId", "").lower(),
                        name=span.get("name", ""),
                        service=service,
                        kind=_KINDS.get(int(span.get("kind", 0)), "UNSPECIFIED"),
                        start_ns=int(span.get("startTimeUnixNano", 0)),
                        end_ns=int(span.get("endTimeUnixNano", 0)),
                        attributes=_attributes(span.get("attributes")),
                        events=tuple(event.get("name", "") for event in span.get("events", [])),
                        status=int(status.get("code", 0)),
                        status_message=status.get("message", ""),
                    )
                )
    return spans


class OtlpReceiver:
    """An OTLP/HTTP receiver (JSON encoding) on `host:port` (0: a free port), serving from a thread."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, on_spans: Callable[[list[ReceivedSpan]], None] | None = None
    ) -> None:
        self._traces: OrderedDict[str, list[ReceivedSpan]] = OrderedDict()
        self._count = 0
        self._lock = threading.Condition()
        self._on_spans = on_spans
        self.exports = 0
        self._last_export = time.monotonic()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if self.path.rstrip("/") != TRACES_PATH:
                    self._answer(404, {"message": f"spans go to POST {TRACES_PATH}"})
                    return
                if not (self.headers.get("Content-Type") or "").startswith("application/json"):
                    self._answer(415, {"message": "this receiver takes OTLP's JSON encoding (application/json)"})
                    return
                try:
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    spans = parse_export(json.loads(body))
                except (ValueError, KeyError, TypeError, OSError) as error:
                    self._answer(400, {"message": f"not an OTLP JSON export: {error}"})
                    return
                receiver._add(spans)
                self._answer(200, {})

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self.exports += 1
            self._last_export = time.monotonic()
            for span in spans:
                self._traces.setdefault(span.trace_id, []).append(span)
                self._traces.move_to_end(span.trace_id)
            self._count += len(spans)
            while self._count > MAX_SPANS and len(self._traces) > 1:
                self._count -= len(self._traces.popitem(last=False)[1])
            self._lock.notify_all()
        if self._on_spans is not None:
            self._on_spans(spans)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return [span for spans in self._traces.values() for span in spans]

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._traces.get(trace_id.lower(), []))

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout: float) -> list[ReceivedSpan]:
        """All spans received, once `done(spans)` holds; raises TimeoutError if it does not within `timeout`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                spans = [span for spans in self._traces.values() for span in spans]
                if done(spans):
                    return spans
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"after {timeout:.0f} s the receiver holds {len(spans)} span(s), not what was awaited"
                    )
                self._lock.wait(left)

    def settle(self, quiet: float, timeout: float) -> list[ReceivedSpan]:
        """All spans received, once no export has arrived for `quiet` seconds from now on.

        Then the senders have sent what they held. Raises TimeoutError if exports keep coming for `timeout` s.
        """
        start = time.monotonic()
        deadline = start + timeout
        with self._lock:
            while (idle := time.monotonic() - max(start, self._last_export)) < quiet:
                if time.monotonic() + quiet - idle > deadline:
                    raise TimeoutError(f"exports kept arriving for {timeout:.0f} s")
                self._lock.wait(quiet - idle)
            return [span for spans in self._traces.values() for span in spans]


def format_trace(spans: list[ReceivedSpan]) -> str:
    """A trace as an indented tree: start offset, duration, service, span name, and its status when an error."""
    if not spans:
        return ""
    ids = {span.span_id for span in spans}
    children: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        # A span whose parent was not received (the caller's, or not yet sent) is shown at the top.
        children.setdefault(span.parent_id if span.parent_id in ids else "", []).append(span)
    origin = min(span.start_ns for span in spans)
    lines = [f"trace {spans[0].trace_id}"]

    def walk(parent: str, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s.start_ns):
            error = f"  ERROR {span.status_message}" if span.status == 2 else ""
            lines.append(
                f"  {(span.start_ns - origin) / 1e6:8.2f} ms {span.duration_ms:8.2f} ms  {'  ' * depth}"
                f"{span.service}: {span.name}{error}"
            )
            walk(span.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)


class _Printer:
    """Prints a trace once no span came for it for `quiet` seconds; appends every span to a JSON-lines file."""

    def __init__(self, quiet: float, out: TextIO, jsonl: TextIO | None) -> None:
        self.quiet = quiet
        self.out = out
        self.jsonl = jsonl
        self._pending: dict[str, tuple[list[float], list[ReceivedSpan]]] = {}  # trace -> ([last span's time], spans)
        self._lock = threading.Lock()

    def __call__(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            for span in spans:
                last, received = self._pending.setdefault(span.trace_id, ([0.0], []))
                last[0] = time.monotonic()
                received.append(span)
                if self.jsonl is not None:
                    self.jsonl.write(json.dumps(asdict(span)) + "\n")
            if self.jsonl is not None:
                self.jsonl.flush()

    def flush(self, everything: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            due = [t for t, (last, _) in self._pending.items() if everything or now - last[0] >= self.quiet]
            for trace_id in due:
                print(format_trace(self._pending.pop(trace_id)[1]), file=self.out, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonnx.commands.traces",
        description="Receive OpenTelemetry spans over OTLP/HTTP (JSON encoding, POST /v1/traces), as tritonserver "
        "and the facade send them, and print each trace as a tree once it is complete. Ctrl-C stops.",
        epilog="Example: python -m tritonnx.commands.traces & python -m tritonnx.commands.serve --otlp-endpoint http://127.0.0.1:4318",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on; default: %(default)s")
    parser.add_argument("--port", type=int, default=4318, help="OTLP/HTTP's usual port; default: %(default)s")
    parser.add_argument(
        "--quiet-seconds",
        type=float,
        default=2.0,
        help="a trace is printed once no span came for it for this long; default: %(default)s",
    )
    parser.add_argument("--jsonl", type=Path, help="also append every span to this file, one JSON object a line")
    args = parser.parse_args(argv)
    jsonl = args.jsonl.open("a") if args.jsonl else None
    printer = _Printer(args.quiet_seconds, sys.stdout, jsonl)
    try:
        receiver = OtlpReceiver(args.host, args.port, on_spans=printer)
    except OSError as error:
        print(f"error: cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with receiver:
        print(f"receiving OTLP/HTTP spans on {receiver.endpoint}{TRACES_PATH}; Ctrl-C stops", flush=True)
        while not stop.wait(0.5):
            printer.flush()
    printer.flush(everything=True)
    if jsonl is not None:
        jsonl.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
