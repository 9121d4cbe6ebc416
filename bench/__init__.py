"""Benchmarks: ``python -m bench NAME [--json] [options]`` from the repository root.

Every benchmark measures its baseline in the same run and prints ratios against it, because
absolute times on shared machines mean little. See bench/README.md.
"""
