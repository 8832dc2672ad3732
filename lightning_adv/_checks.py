"""Validators shared by every config and input check.

Each error is a ``ValueError`` that names the key as the user wrote it
(``actor.reward_norm.eps``), what was expected and what was given.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any, NoReturn, Optional

import torch

# Frames a warning is not attributed to: the pipeline's own modules (not the trainer's),
# torch's (the no_grad wrapper, nn.Module.__call__) and dataclass-generated __init__s.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TRAINER_DIR = os.path.join(_PACKAGE_DIR, "trainer") + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def fail(key: str, expected: str, got: Any) -> NoReturn:
    raise ValueError(f"{key}: expected {expected}, got {got!r}")


def is_int(value: Any, minimum: Optional[int] = None, maximum: Optional[int] = None) -> bool:
    """An ``int`` (never a ``bool``) within the bounds."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and (minimum is None or value >= minimum) and (maximum is None or value <= maximum))


def check_int(key: str, value: Any, minimum: Optional[int] = 1,
              maximum: Optional[int] = None) -> None:
    if not is_int(value, minimum, maximum):
        bounds = {(1, None): "a positive integer"}.get((minimum, maximum))
        if bounds is None:
            low = f" >= {minimum}" if minimum is not None else ""
            high = f" <= {maximum}" if maximum is not None else ""
            bounds = f"an integer{low}{' and' if low and high else ''}{high}"
        fail(key, bounds, value)


def check_number(key: str, value: Any, *, minimum: Optional[float] = None,
                 maximum: Optional[float] = None, positive: bool = False,
                 allow_inf: bool = False) -> None:
    """A real number (never a ``bool``): finite unless ``allow_inf``, within the bounds,
    and ``> 0`` with ``positive``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(key, "a number", value)
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        fail(key, "a finite number", value)
    if positive and not value > 0:
        fail(key, "a number > 0", value)
    if minimum is not None and value < minimum:
        fail(key, f"a number >= {minimum}", value)
    if maximum is not None and value > maximum:
        fail(key, f"a number <= {maximum}", value)


def check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(key, "true or false", value)


def check_choice(key: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        shown = ", ".join("null" if c is None else repr(c) for c in choices)
        fail(key, f"one of {shown}", value)


def check_gvpo_kwargs(key: str, kwargs: Mapping[str, Any]) -> None:
    """GVPO's three values, each finite and non-negative."""
    for name in ("negative_scale", "zero_penalty", "zero_eps"):
        value = kwargs[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            # Worded as the legacy error, which callers of the call-time config may match.
            raise ValueError(f"{key}: GVPO {name} must be finite and non-negative, got {value!r}")


def non_negative_number(key: str, value: Any) -> None:
    check_number(key, value, minimum=0.0)


def positive_number(key: str, value: Any) -> None:
    check_number(key, value, positive=True)


def unit_interval(key: str, value: Any) -> None:
    check_number(key, value, minimum=0.0, maximum=1.0)


def warn_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the code that called into the pipeline (a user's
    ``module(batch)`` or ``ActorConfig(...)``), not to a frame inside it, so the location
    printed with the warning is the caller's and the default filter shows it once there."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)


def _internal(filename: str) -> bool:
    if filename == "<string>":
        return True
    path = os.path.abspath(filename)
    return (path.startswith(_PACKAGE_DIR) and not path.startswith(_TRAINER_DIR)) \
        or path.startswith(_TORCH_DIR)
