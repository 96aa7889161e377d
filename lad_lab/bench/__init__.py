"""Benchmarks behind ``lad bench``: they print a table and write JSON under bench/results/."""
