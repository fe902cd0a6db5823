"""How ``default_collate`` stacks tensors in a threadloader worker: never in shared memory it need not use.

``default_collate`` stacks a batch into *shared memory* whenever worker info is
set, to save a copy when sending the batch to the parent process. Worker
threads share the consumer's memory already, so that allocation is pure cost:
there the batch is stacked into this process's memory. In a
``worker_processes`` child the batch does travel to the parent: it is stacked
into the child's arena of reused shared-memory blocks
(:mod:`threadloader.procs.arena`), which saves a fresh segment per batch.
Anywhere else (a DataLoader worker process, the main thread) torch's own
entry runs. :func:`install` puts :func:`collate_tensor` in
``default_collate_fn_map`` (through the torch adapter).
"""

from __future__ import annotations

from typing import Any

import torch

from .._platform import torch_compat as _torch_compat
from . import context as _context

__all__ = ["collate_tensor", "install"]

_original = _torch_compat.original_collate_tensor


def collate_tensor(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """``default_collate``'s entry for tensors, as a threadloader worker runs it (see the module's doc)."""
    if _torch_compat.get_thread_worker_info() is None:
        return _original(batch, collate_fn_map=collate_fn_map)
    elem = batch[0]
    arena = _context.child_arena()
    if arena is not None and (type(elem) is not torch.Tensor or elem.device.type != "cpu" or elem.is_nested
                              or elem.layout is not torch.strided or elem.is_conj() or elem.is_neg()
                              or elem.is_quantized):
        return _original(batch, collate_fn_map=collate_fn_map)  # shared memory, as DataLoader's
    if elem.is_nested or elem.layout is not torch.strided:
        # torch's own checks and errors, with the worker info hidden for this
        # call only (thread-local: other threads are unaffected).
        with _torch_compat.worker_info_hidden():
            return _original(batch, collate_fn_map=collate_fn_map)
    # Made and stacked into as a worker process makes its shared-memory batch
    # (``out=``), step for step: the same result dtype, and the same errors
    # (a sample without numel(), a conjugate view, a float sample in a Long
    # batch, samples that require grad) as with DataLoader's workers; only
    # the memory differs (this process's, not shared).
    numel = sum(x.numel() for x in batch)
    if numel < len(batch) * elem.numel():
        # A worker process's batch storage holds ``numel`` items and cannot
        # grow: its resize to the first sample's shape fails, with these words.
        raise RuntimeError("Trying to resize storage that is not resizable")
    if elem.is_conj() or elem.is_neg() or elem.is_quantized:
        # Views and types whose batch torch's own steps refuse: take them.
        storage = _torch_compat.typed_storage(numel, elem.dtype, elem.device)
        out = elem.new(storage).resize_(len(batch), *list(elem.size()))
    elif arena is not None:
        out = arena.take((len(batch), *elem.shape), elem.dtype)
    else:  # the same tensor, made faster than through a TypedStorage
        # Not for a wrapper subclass (torch's TwoTensor): a worker process's
        # ``elem.new(storage)`` there makes a plain tensor of the wrong values
        # (a torch bug); this makes the subclass batch, as num_workers=0 does,
        # and a subclass refusing both names ``new_empty`` in its error.
        out = elem.new_empty((len(batch), *elem.shape))
    return torch.stack(batch, 0, out=out)


def install() -> None:
    """Make :func:`collate_tensor` default_collate's entry for tensors (idempotent)."""
    _torch_compat.replace_collate_tensor(collate_tensor)
