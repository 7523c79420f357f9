"""Benchmarks: each runs as ``python -m bench.<name>`` from the project root, prints a table and can
write JSON under bench/results/."""
