"""Test utilities: reference implementations and synthetic inputs for tests and benchmarks."""
