"""The one load engine of the benchmarks: targets, the loops that call them, and what they saw (`stats`)."""
