"""Seeing a run: failure records, ``results.json`` and the summary, tracking, profiling,
throughput, traces of every rank, plots."""
