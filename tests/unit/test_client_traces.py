"""The OTLP/HTTP receiver of `python -m tritonnx.commands.traces`, over real HTTP on a free loopback port."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tritonnx.commands.traces import OtlpReceiver, format_trace, parse_export


def span(name: str, span_id: str, parent: str = "", start: int = 0, end: int = 1_000_000, **extra) -> dict:
    return {
        "traceId": "0AF7651916CD43DD8448EB211C80319C",
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": 2,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [
            {"key": "triton.model_version", "value": {"intValue": "1"}},
            {"key": "ok", "value": {"boolValue": True}},
        ],
        **extra,
    }


def export(service: str, *spans: dict) -> dict:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "s"}, "spans": list(spans)}]}]}


def post(url: str, body: bytes, content_type: str = "application/json", **headers: str) -> int:
    request = urllib.request.Request(url, body, {"Content-Type": content_type, **headers}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.loads(response.read()) == {}
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_spans_from_two_services_join_into_one_trace_tree():
    with OtlpReceiver() as receiver:
        url = receiver.endpoint + "/v1/traces"
        assert post(url, json.dumps(export("tritonnx-facade", span("Predict", "a1", start=0, end=9_000_000))).encode())
        # Triton's exporter may compress; the second batch comes gzipped.
        triton = export("tritonserver", span("InferRequest", "b2", parent="a1", start=1_000_000, end=8_000_000))
        assert post(url, gzip.compress(json.dumps(triton).encode()), **{"Content-Encoding": "gzip"}) == 200
        spans = receiver.wait_for(lambda s: len(s) == 2, 5)
    assert {s.service for s in spans} == {"tritonnx-facade", "tritonserver"}
    assert spans[1].attributes == {"triton.model_version": 1, "ok": True}
    tree = format_trace(spans).splitlines()
    assert tree[0] == "trace 0af7651916cd43dd8448eb211c80319c"
    assert tree[1].split() == ["0.00", "ms", "9.00", "ms", "tritonnx-facade:", "Predict"]
    assert tree[2].split() == ["1.00", "ms", "7.00", "ms", "tritonserver:", "InferRequest"]
    assert tree[2].index("tritonserver") > tree[1].index("tritonnx-facade")  # indented under its parent


@pytest.mark.parametrize(
    ("path", "content_type", "body", "status"),
    [
        ("/v1/traces", "application/x-protobuf", b"\x0a\x00", 415),
        ("/v1/metrics", "application/json", b"{}", 404),
        ("/v1/traces", "application/json", b"{not json", 400),
        ("/v1/traces", "application/json", json.dumps(export("x", {"name": "no ids"})).encode(), 400),
    ],
)
def test_what_is_not_an_otlp_json_trace_export_is_refused_with_why(path, content_type, body, status):
    with OtlpReceiver() as receiver:
        assert post(receiver.endpoint + path, body, content_type) == status
        assert receiver.spans() == []


def test_an_errored_span_shows_its_status_in_the_tree():
    spans = parse_export(export("f", span("Predict", "a1", status={"code": 2, "message": "UNAVAILABLE: retry"})))
    assert format_trace(spans).splitlines()[1].endswith("f: Predict  ERROR UNAVAILABLE: retry")


def test_the_command_has_help():
    result = subprocess.run(
        [sys.executable, "-m", "tritonnx.commands.traces", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "OTLP/HTTP" in result.stdout and "--jsonl" in result.stdout
