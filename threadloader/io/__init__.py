"""Image decoding, crop selection and array loading for data-loading threads.

``threadloader.io`` is the public import path; each job lives in its own module:

* :mod:`threadloader.images.decode` -- :func:`decode_image`, :func:`image_size`:
  a path or bytes to a :class:`~threadloader.Frame` (simplejpeg / TurboJPEG /
  Pillow), resized straight into the batch by ``frame_collate``.
* :mod:`threadloader.images.crop` -- :func:`random_resized_crop_params`,
  :class:`RandomResizedCropLoader`: torchvision's ``RandomResizedCrop`` drawn
  from the header, decoded at the smallest DCT scale the crop allows.
* :mod:`threadloader.images.arrays` -- :func:`load_npy`, :func:`load_npz`:
  NumPy files in memory, returned as views.
"""

from __future__ import annotations

from ..images.arrays import load_npy, load_npz
from ..images.crop import RandomResizedCropLoader, random_resized_crop_params
from ..images.decode import ImageDecodeError, Source, decode_image, image_size

__all__ = [
    "ImageDecodeError",
    "Source",
    "decode_image",
    "image_size",
    "random_resized_crop_params",
    "RandomResizedCropLoader",
    "load_npy",
    "load_npz",
]
