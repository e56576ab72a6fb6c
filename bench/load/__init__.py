"""The one load engine of the benchmarks.

Targets to call (`targets`, `http`), the closed and open loops that call them (`loops`), a burst of calls started at
once (`burst`) and what they saw, summed up (`stats`). `make bench`, `make bench-peers`, `make soak` and `make chaos`
all drive their load through it.
"""
