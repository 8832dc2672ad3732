"""Runnable examples; run each from the repository root with ``python -m examples.<name>``.

The stage functions here are referenced from configs by their import path, e.g.
``examples.scale_outcome.scale_outcome``.
"""
