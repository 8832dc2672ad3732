"""Policies: what the trainer samples from, scores and trains.

:class:`~.base.Policy` (in :mod:`.base`) is the interface the trainer calls; its
implementations are the built-in tiny transformer (:mod:`.tiny`) and a Hugging Face causal
LM (:mod:`.hf`). Each implementation keeps its speed shortcuts to itself.
"""
