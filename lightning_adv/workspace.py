"""Scratch memory that one ``AdvantageModule`` reuses from call to call (CPU only).

Why: with glibc's default allocator a large freed block is handed back to the operating
system, so a call that allocates its ``[B, T]`` temporaries afresh pays a page fault per
4 KiB page every time (several microseconds each on a virtual machine: more than the
arithmetic on those pages). A :class:`Workspace` keeps the memory of the temporaries
and hands it out again; PyTorch's CUDA allocator already caches, so on other devices
:func:`scratch` is a plain ``torch.empty``.

How reuse stays invisible:

* a buffer is handed out only while nothing else references its memory (its storage's
  use count is the pool's own), so a temporary still alive is never handed out twice:
  correctness never depends on call sites agreeing on lifetimes;
* only temporaries come from :func:`scratch`: every tensor returned to a caller outside
  the pipeline (an output, an input handed to a user stage) is a fresh allocation, so the
  outputs of two calls never share storage;
* a workspace is active only inside :meth:`Workspace.active` (a context variable: other
  threads, and the bare kernels called from user code, allocate as usual), and each
  thread has its own (:class:`ThreadWorkspaces`).

A workspace holds, between calls, as many byte buffers as temporaries were alive at once
(any dtype), each as large as the largest asked for (a narrower batch reuses them); it
is freed with its module, or by :meth:`Workspace.release`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Optional

import torch
from torch import Tensor

_ACTIVE: ContextVar[Optional["Workspace"]] = ContextVar("lightning_adv_workspace", default=None)

_use_count = getattr(torch._C, "_storage_Use_Count", None)


class _Buffer:
    __slots__ = ("flat", "size", "storage", "typed", "free_count")

    def __init__(self, nbytes: int):
        self.size = -(-nbytes // 8) * 8  # any dtype's itemsize divides it
        self.flat = torch.empty(self.size, dtype=torch.uint8)
        self.storage = self.flat.untyped_storage()
        self.typed: dict[torch.dtype, Tensor] = {}
        # The references of the pool itself: the flat tensor, the storage object and each
        # cached typed view.
        self.free_count = _use_count(self.storage._cdata)

    def view(self, shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        typed = self.typed.get(dtype)
        if typed is None:
            typed = self.typed[dtype] = self.flat.view(dtype)
            self.free_count += 1
        return typed.as_strided(shape, strides)


class Workspace:
    """Flat CPU byte buffers, handed out as contiguous tensors of any dtype while nothing
    else references them: memory a temporary of one dtype held is reused by the next
    temporary of any dtype, so the pool holds the most bytes alive at once."""

    def __init__(self) -> None:
        self._pool: list[_Buffer] = []  # smallest first

    def take(self, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        """An uninitialized contiguous CPU tensor of ``shape`` whose memory nothing else
        references: the smallest free buffer that fits, else a new one (replacing a free
        buffer that is too small, so the pool does not grow past what is alive at once)."""
        shape = tuple(shape)
        strides = [1] * len(shape)
        for i in range(len(shape) - 1, 0, -1):
            strides[i - 1] = strides[i] * shape[i]
        nbytes = max(strides[0] * shape[0] if shape else 1, 1) * dtype.itemsize
        too_small = None
        for i, buffer in enumerate(self._pool):
            if _use_count(buffer.storage._cdata) == buffer.free_count:
                if buffer.size >= nbytes:
                    return buffer.view(shape, tuple(strides), dtype)
                if too_small is None:
                    too_small = i
        if too_small is not None:
            del self._pool[too_small]
        buffer = _Buffer(nbytes)
        self._pool.append(buffer)
        self._pool.sort(key=lambda b: b.size)
        return buffer.view(shape, tuple(strides), dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(b.size for b in self._pool)

    def release(self) -> None:
        """Free every buffer (the next call allocates again)."""
        self._pool.clear()

    @contextlib.contextmanager
    def active(self) -> Iterator["Workspace"]:
        """:func:`scratch` calls inside the block (this thread, this context) use this
        workspace."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)


class ThreadWorkspaces:
    """One :class:`Workspace` per thread (a module called from two threads at once must
    not hand both the same memory). Copies and pickles start empty: buffers are a cache."""

    def __init__(self) -> None:
        self._by_thread: dict[int, Workspace] = {}

    def get(self) -> Workspace:
        ident = threading.get_ident()
        workspace = self._by_thread.get(ident)
        if workspace is None:
            workspace = self._by_thread[ident] = Workspace()
        return workspace

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in list(self._by_thread.values()))

    def release(self) -> None:
        self._by_thread.clear()

    def __getstate__(self) -> dict:
        return {"_by_thread": {}}


def scratch(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialized temporary of ``shape``: workspace memory on CPU while a workspace
    is active, else ``torch.empty``. Never return it (or a view) to a caller outside the
    pipeline."""
    workspace = _ACTIVE.get()
    if workspace is None or device.type != "cpu" or _use_count is None:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    numel = 1
    for size in shape:
        numel *= size
    if numel * dtype.itemsize < MIN_BYTES:  # glibc reuses small blocks without faults
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    return workspace.take(shape, dtype)


#: Smaller temporaries are plain allocations: glibc keeps blocks below its mmap threshold
#: (128 KiB at first) in the heap, and the pool's bookkeeping would cost more.
MIN_BYTES = 128 << 10
