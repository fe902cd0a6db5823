"""``threadloader.device``: the public path of :func:`to_device`, :class:`DeviceLoader` and :class:`ImageTransform`.

They are defined in :mod:`threadloader.images.device` and
:mod:`threadloader.images.transform`; this module re-exports them.
"""

from __future__ import annotations

from .images.device import DeviceLoader, ImageTransform, to_device

__all__ = ["to_device", "DeviceLoader", "ImageTransform"]
