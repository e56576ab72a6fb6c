"""One-off measurements, each run to back a claim or a decision (README.md here: study, command, report, claim).

Not part of `make bench`, `make soak`, `make chaos` or `make tune`: run one as `python -m bench.studies.<name>`
(`--help` for its options). Each serves from the checkout's model repository on free loopback ports and writes
bench/results/<UTC time>-<name>/; a run worth keeping is copied to bench/reports/.
"""
