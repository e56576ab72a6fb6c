"""python -m bench.attacks: single crafted requests from a stranger against a facade of its defaults (`make chaos`).

docs/benchmarks.md#the-attack-campaign-make-chaos says what is sent and judged. Modules: `payloads.py` (the bodies),
`calls.py` (raw calls), `proxy.py` (a body that stalls near its end), `watch.py` (the probe and the facade's memory),
`catalog.py` (the attacks), `campaign.py` (the run), `report.py` (its gates, report and results).
"""
