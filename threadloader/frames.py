"""``threadloader.frames``: the public path of :class:`Frame` and :func:`frame_collate`.

They are defined in :mod:`threadloader.images.frames`; this module re-exports them.
"""

from __future__ import annotations

from .images.frames import Frame, frame_collate

__all__ = ["Frame", "frame_collate"]
