"""The CPU loops of ``lightning_adv/_native.c``, loaded with ctypes.

Why a C loop: GAE (per token or per turn) is a recurrence along each row. As whole-tensor torch operations it
takes a dozen int64/float64 passes over ``[B, T]`` (running counts, a scatter and a
gather for the next values, rescaled cumulative sums, flips); as a loop it is one pass,
and the checks and alignment of the advantage pipeline ride in the same pass while the
row is in cache (:mod:`lightning_adv.fused`). The torch versions stay: they run on CUDA,
where there is no such loop, and wherever the library is missing, and they define the
numbers the loops are tested against.

When it runs: CPU tensors of the dtypes below, with the library built. ``pip install``
compiles it (``pyproject.toml``: an optional extension, so an install without a C
compiler still succeeds and runs the torch kernels). ``LIGHTNING_ADV_NATIVE=0`` in the
environment turns it off for a process; :func:`disabled` for a block (tests compare both
paths that way). :data:`STATUS` says which is in use and why.

Calls go through ctypes, which releases the GIL for the call; none allocates tensors.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

#: Must equal ``LA_ABI_VERSION`` in ``_native.c``: a library built from another version of
#: the C file (an editable install not rebuilt since it changed) is not used.
ABI_VERSION = 4
#: Mask dtypes the loops read directly (``MASK_*`` in ``_native.c``); others go through
#: torch.
MASK_KINDS = {torch.uint8: 0, torch.int32: 1, torch.int64: 2, torch.float32: 3,
              torch.float64: 4, torch.bool: 5}
KL_ESTIMATORS = {None: 0, "k1": 1, "k2": 2, "k3": 3}
#: Where every tensor the loops write is allocated (whatever torch's default device is).
CPU = torch.device("cpu")
#: The checks the fused pass reports, in the order of ``checks`` (``CHECK_*``).
CHECKS = ("masks", "logprobs_not_finite", "logprobs_above", "values_not_finite",
          "ref_logp_not_finite", "ref_logp_above")

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int
_F64 = ctypes.c_double

_SIGNATURES = {
    "la_abi_version": ([], _I64),
    "la_token_gae": ([_I64, _I64, _INT, _P, _P, _P, _INT, _P, _F64, _F64, _P, _P, _P], _I64),
    "la_turn_gae": ([_I64, _I64, _INT, _P, _P, _P, _INT, _P, _INT, _P, _F64, _F64, _P, _P, _P],
                    _I64),
    "la_token_pipeline": ([_I64, _I64, _P, _INT, _P, _INT, _P, _P, _P, _P, _P, _INT, _F64,
                           _F64, _F64, _INT, _F64] + [_P] * 12, _I64),
    "la_masked_moments": ([_I64, _I64, _P, _P, _P, _P], None),
    "la_masked_affine": ([_I64, _I64, _P, _P, _P, _P, _P], None),
}


def _load() -> tuple[Optional[ctypes.CDLL], str]:
    if os.environ.get("LIGHTNING_ADV_NATIVE", "1") == "0":
        return None, "off (LIGHTNING_ADV_NATIVE=0): the torch kernels run"
    spec = importlib.util.find_spec("lightning_adv._native")
    if spec is None or not spec.origin:
        return None, ("not built (no C compiler at install time?): the torch kernels run; "
                      "`pip install -e .` with gcc or clang builds it")
    try:
        lib = ctypes.CDLL(spec.origin)
        version = lib.la_abi_version()
    except (OSError, AttributeError) as exc:
        return None, f"not loadable ({exc}): the torch kernels run"
    if version != ABI_VERSION:
        return None, (f"built from another version of _native.c (ABI {version}, this "
                      f"package wants {ABI_VERSION}): the torch kernels run until "
                      f"`pip install -e .` rebuilds it")
    for name, (argtypes, restype) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib, f"on ({spec.origin})"


_LIB, STATUS = _load()
_enabled = _LIB is not None


def available() -> bool:
    """Whether the loops are built, loadable and not turned off by the environment."""
    return _LIB is not None


def active() -> bool:
    """Whether CPU calls use the loops now (:func:`available`, and not inside
    :func:`disabled`)."""
    return _enabled


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """The torch kernels inside the block, as on CUDA or without the library (process-wide:
    for tests and benchmarks, not for concurrent use)."""
    global _enabled
    previous, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = previous


def runs_on(*tensors: Tensor) -> bool:
    """Whether the loops take these tensors: :func:`active` and every one on the CPU."""
    return _enabled and all(t.device.type == "cpu" for t in tensors)


def _ptr(t: Optional[Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _gae_outputs(rewards: Tensor) -> tuple[Tensor, Tensor]:
    """Fresh advantages and returns for a GAE loop: every position is written."""
    return (torch.empty(rewards.shape, dtype=rewards.dtype, device=CPU),
            torch.empty(rewards.shape, dtype=rewards.dtype, device=CPU))


def token_gae(rewards: Tensor, values: Tensor, loss_mask: Tensor, bootstrap: Tensor,
              discount: float, coef: Union[float, Tensor]) -> tuple[Tensor, Tensor, int]:
    """The loop of :func:`lightning_adv.kernels.compute_token_gae` on contiguous CPU
    ``rewards``/``values`` of one dtype (float32 or float64, the outputs' too),
    ``bootstrap`` [B] in that dtype, a mask of a :data:`MASK_KINDS` dtype, and ``coef``
    (γλ as the torch kernel rounds it) a float or a [B] float64 tensor. Returns
    ``(advantages, returns, bad_row)``: ``bad_row`` is 1 + the first row whose mask holds
    something other than 0 and 1 (the outputs are then incomplete), else 0."""
    bs, width = rewards.shape
    adv, ret = _gae_outputs(rewards)
    row_coef = coef if isinstance(coef, Tensor) else None
    status = _LIB.la_token_gae(bs, width, int(rewards.dtype == torch.float64),
                               rewards.data_ptr(), values.data_ptr(), loss_mask.data_ptr(),
                               MASK_KINDS[loss_mask.dtype], bootstrap.data_ptr(), discount,
                               0.0 if row_coef is not None else coef, _ptr(row_coef),
                               adv.data_ptr(), ret.data_ptr())
    if status < 0:
        raise MemoryError(f"lightning_adv native token GAE: no memory for a row of {width}")
    return adv, ret, int(status)


#: Turn-id dtypes the turn loop reads.
TURN_ID_KINDS = {torch.int32: 0, torch.int64: 1}


def turn_gae(rewards: Tensor, values: Tensor, loss_mask: Tensor, turn_ids: Tensor,
             bootstrap: Tensor, discount: float,
             coef: Union[float, Tensor]) -> tuple[Tensor, Tensor, int, int]:
    """The loop of :func:`lightning_adv.kernels.compute_turn_gae`: arguments as
    :func:`token_gae`, plus int32/int64 ``turn_ids``. Returns ``(advantages, returns,
    bad_mask_row, bad_ids_row)``, each ``bad_*`` 1 + the first offending row or 0 (the
    outputs are then incomplete)."""
    bs, width = rewards.shape
    adv, ret = _gae_outputs(rewards)
    row_coef = coef if isinstance(coef, Tensor) else None
    status = _LIB.la_turn_gae(bs, width, int(rewards.dtype == torch.float64),
                              rewards.data_ptr(), values.data_ptr(), loss_mask.data_ptr(),
                              MASK_KINDS[loss_mask.dtype], turn_ids.data_ptr(),
                              TURN_ID_KINDS[turn_ids.dtype], bootstrap.data_ptr(), discount,
                              0.0 if row_coef is not None else coef, _ptr(row_coef),
                              adv.data_ptr(), ret.data_ptr())
    if status == -1:
        raise MemoryError(f"lightning_adv native turn GAE: no memory for a row of {width}")
    if status <= -2:
        return adv, ret, 0, int(-1 - status)
    return adv, ret, int(status), 0


@dataclass(frozen=True)
class PipelineOutputs:
    """What :func:`token_pipeline` computes; [B, T] float32 unless said otherwise."""

    mask: Tensor
    """the aligned loss mask"""
    old_logp: Tensor
    ref_logp: Optional[Tensor]
    kl: Optional[Tensor]
    """None without a KL penalty"""
    total_rewards: Tensor
    advantages: Tensor
    returns: Tensor
    seqlens: Tensor
    """[B] int64"""
    is_truncated: Tensor
    """[B] bool"""
    dropped: Tensor
    """[B] bool: the outcome score landed on an inactive position"""
    bootstrap: Tensor
    """[B]"""
    failed: frozenset[str]
    """the names of the :data:`CHECKS` that failed"""


def token_pipeline(attention: Tensor, loss: Tensor, logprobs: Tensor, ref_logp: Optional[Tensor],
                   values: Tensor, scores: Tensor, truncated: Optional[Tensor], *,
                   zero_truncated_scores: bool, discount: float, coef: float, kl_ctl: float,
                   kl_estimator: Optional[str], tolerance: float) -> PipelineOutputs:
    """``la_token_pipeline`` (:mod:`lightning_adv.fused` is the caller): contiguous CPU
    masks of :data:`MASK_KINDS` dtypes, float32 log-probs and values, float32 [B] scores,
    ``truncated`` a [B] uint8 tensor or None."""
    bs, width = attention.shape

    def new() -> Tensor:
        return torch.empty((bs, width), dtype=torch.float32, device=CPU)

    mask, old, total, adv, ret = new(), new(), new(), new(), new()
    ref = new() if ref_logp is not None else None
    kl = new() if kl_estimator is not None else None
    seqlens = torch.empty(bs, dtype=torch.int64, device=CPU)
    is_truncated = torch.empty(bs, dtype=torch.bool, device=CPU)
    dropped = torch.empty(bs, dtype=torch.bool, device=CPU)
    bootstrap = torch.empty(bs, dtype=torch.float32, device=CPU)
    checks = torch.empty(len(CHECKS), dtype=torch.float64, device=CPU)
    status = _LIB.la_token_pipeline(
        bs, width, attention.data_ptr(), MASK_KINDS[attention.dtype], loss.data_ptr(),
        MASK_KINDS[loss.dtype], logprobs.data_ptr(), _ptr(ref_logp), values.data_ptr(),
        scores.data_ptr(), _ptr(truncated), int(zero_truncated_scores), discount, coef, kl_ctl,
        KL_ESTIMATORS[kl_estimator], tolerance, mask.data_ptr(), old.data_ptr(), _ptr(ref),
        _ptr(kl), total.data_ptr(), adv.data_ptr(), ret.data_ptr(), seqlens.data_ptr(),
        is_truncated.data_ptr(), dropped.data_ptr(), bootstrap.data_ptr(), checks.data_ptr())
    if status < 0:
        raise MemoryError(f"lightning_adv native pipeline: no memory for a row of {width}")
    failed = frozenset(name for name, flag in zip(CHECKS, checks.tolist()) if flag)
    return PipelineOutputs(mask, old, ref, kl, total, adv, ret, seqlens, is_truncated, dropped,
                           bootstrap, failed)


def _check_same_shape(x: Tensor, mask: Tensor) -> None:
    if mask.shape != x.shape or x.ndim != 2:
        raise ValueError(f"lightning_adv native normalization: mask of shape "
                         f"{tuple(mask.shape)} for advantages of shape {tuple(x.shape)}; "
                         f"expected both [B, T] and equal")


def masked_moments(x: Tensor, mask: Tensor) -> tuple[Tensor, float]:
    """Per row of float32 ``x`` over float32 0/1 ``mask``: ``[B, 3]`` float64 (count, sum
    and sum of squares of ``x - shift`` at the masked positions), and ``shift`` (the batch's
    first masked value). See :func:`lightning_adv.normalization._normalize_tokens_native`."""
    _check_same_shape(x, mask)
    bs, width = x.shape
    moments = torch.empty((bs, 3), dtype=torch.float64, device=CPU)
    shift = ctypes.c_double()
    _LIB.la_masked_moments(bs, width, x.data_ptr(), mask.data_ptr(), ctypes.addressof(shift),
                           moments.data_ptr())
    return moments, shift.value


def masked_affine(x: Tensor, mask: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """``(x·mask - shift·mask) / scale`` with per-row float32 ``shift`` and ``scale``
    ([B]), as a new float32 tensor: the float32 operations of the torch normalization."""
    _check_same_shape(x, mask)
    bs, width = x.shape
    out = torch.empty((bs, width), dtype=torch.float32, device=CPU)
    _LIB.la_masked_affine(bs, width, x.data_ptr(), mask.data_ptr(), shift.data_ptr(),
                          scale.data_ptr(), out.data_ptr())
    return out
