"""The image path: decode, crop, frames, batch buffers, transforms on the device.

Nothing here is imported by ``import threadloader``; the public paths are
``threadloader.io`` (decode, crop, arrays), ``threadloader.frames`` and
``threadloader.device``.

* :mod:`.decode` -- :func:`~.decode.decode_image`, :func:`~.decode.image_size` (simplejpeg / TurboJPEG / Pillow);
* :mod:`.crop` -- torchvision's ``RandomResizedCrop`` drawn from the header;
* :mod:`.arrays` -- NumPy files in memory;
* :mod:`.frames` -- :class:`~.frames.Frame` and ``frame_collate``: frames resized straight into the batch;
* :mod:`.buffers` -- the reused host memory batches and decoded pixels live in
  (reserved per running loader through :mod:`threadloader.engine.hooks`);
* :mod:`.device` -- ``to_device``, :class:`~.device.DeviceLoader` and :class:`~.device.ImageTransform`;
* :mod:`.datagen` -- synthetic image data sets (tests, benchmarks).
"""
