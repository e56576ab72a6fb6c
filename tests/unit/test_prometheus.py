"""The one reader of /metrics pages: values and histograms as prometheus_client writes them."""

import math

from tritonnx.client.facade.metrics import FacadeMetrics
from tritonnx.server.prometheus import MetricsPage, bucket_quantile


def test_a_histograms_buckets_and_quantile_bound_read_back_what_was_observed():
    metrics = FacadeMetrics()
    for seconds in [0.0002] * 98 + [0.003, 0.2]:
        metrics.rejection_latency.labels("overloaded").observe(seconds)
    metrics.rejection_latency.labels("too_large").observe(0.9)
    page = MetricsPage.parse(metrics.render().decode())
    overloaded = page.buckets("tritonnx_facade_rejection_duration_seconds", reason="overloaded")
    assert overloaded[0.0001] == 0 and overloaded[0.00025] == 98 and overloaded[math.inf] == 100
    assert bucket_quantile(overloaded, 0.5) == 0.00025
    assert bucket_quantile(overloaded, 0.99) == 0.005  # the 99th of 100 is the 3 ms one: its bucket's bound
    assert bucket_quantile(overloaded, 1.0) == 0.25
    every = page.buckets("tritonnx_facade_rejection_duration_seconds")  # both reasons summed
    assert every[math.inf] == 101 and bucket_quantile(every, 1.0) == 1.0
    assert page.value("tritonnx_facade_rejection_duration_seconds_count", reason="too_large") == 1


def test_an_empty_histogram_has_no_quantile():
    assert math.isnan(bucket_quantile({}, 0.99))
    assert math.isnan(bucket_quantile({0.1: 0.0, math.inf: 0.0}, 0.99))
