"""Benchmark commands: each prints a table, writes JSON and a PNG plot (``polymixer bench <what>``)."""
