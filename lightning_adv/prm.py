"""The seed's call-time ``prm=`` argument (``module(batch, meta, prm=...)``), resolved in
one place.

Rules of the design note: an explicit ``process_adv_shaping`` beats the call-time mode
(``auto`` follows it, else ``additive``); explicit ``gvpo`` kwargs override the call-time
GVPO values key by key; a full replacement gets ``prm`` as is.
"""

from __future__ import annotations

from typing import Any, Optional

from lightning_adv.config import (
    PRM_MODES, ActorConfig, PRMAdvantageShapingConfig, check_process_mode)
from lightning_adv.stages import Stage


def resolve_process_mode(prm: Any, config: ActorConfig,
                         stage: Optional[Stage]) -> Optional[tuple[str, dict[str, Any]]]:
    """Check ``prm`` and return the built-in process mode and kwargs that run for it, or
    None when no built-in runs (a user process stage, or a full replacement: ``stage``
    None)."""
    if prm is not None:
        if not isinstance(prm, PRMAdvantageShapingConfig):
            raise TypeError(f"prm: expected a PRMAdvantageShapingConfig or None, got "
                            f"{type(prm).__name__}")
        if prm.mode not in PRM_MODES:
            raise ValueError(f"prm.mode: expected one of {', '.join(PRM_MODES)}, got {prm.mode!r}")
    if stage is None or not stage.builtin:
        return None
    mode = stage.implementation
    if mode == "auto":
        if prm is not None:
            check_process_mode("prm.mode", prm.mode, config)
        mode = prm.mode if prm is not None else "additive"
    if mode != "gvpo":
        return mode, {}
    legacy = prm if prm is not None else PRMAdvantageShapingConfig()
    return mode, {**legacy.gvpo_kwargs(), **stage.kwargs}
