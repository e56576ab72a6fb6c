"""python -m bench.attacks: single crafted requests from a stranger against a facade of its defaults (`make chaos`).

It serves resnet50 (the facade's default model) and mobilenet_v3_small with tritonserver and a facade on free
loopback ports, the facade with its default settings, and sends each attack as raw bytes on a raw gRPC channel:
Predicts with a swollen `model_version`, millions of `priority` fields, unpacked `data` floats, a packed `shape`
or empty `output_names`, a PredictStream written and never read, calls that send headers and no body; each at the
size measured by hand (issue 30) and again just under the facade's message limit (read from the facade's own
`--help`), so that it reaches the decoder. Then calls without the bearer token to a facade with `--auth-token`, each
with a body at the limit, and 1,000 Predicts at once on one connection.

Meanwhile a probe (`watch.py`) sends a valid Predict and a GET of /metrics every 0.5 s with a 2 s limit, and the
facade's RSS is sampled every 50 ms. Gates (`report.py`): every attack call ends with a documented status and is
answered within 1 s (calls held without their body end at the facade's body deadline or when the attacker stops,
and are only recorded), the probe never fails and its slowest call during an attack stays within 100 ms of its
slowest before them, the facade's peak RSS rises less than 256 MiB per attack and is back within 64 MiB of its
start after a minute idle. report.md and results.json go to the run folder; a failed gate exits 1.

Modules: `payloads.py` (the bodies), `calls.py` (raw calls), `proxy.py` (a body that stalls near its end),
`watch.py` (probe and memory), `catalog.py` (the attacks), `campaign.py` (the run), `report.py`.
"""
