"""The loader configurations the bench compares, one cell (loader, config, workers) at a time.

Loaders (rows of the table):

* ``DataLoader``: torch's DataLoader, worker processes, the classic PIL +
  torchvision pipeline (``Resize`` + ``PILToTensor`` [+ ``ConvertImageDtype``
  + ``Normalize``], ``default_collate`` [+ ``pin_memory`` and ``.to(device)``]);
* ``DataLoader + kernel``: DataLoader's worker processes running the frame
  kernel ThreadDataLoader runs (``decode_image`` + ``frame_collate`` [+
  :func:`threadloader.to_device`]), so that processes and threads compare on
  the same per-image work (normalized in the workers by ``frame_collate`` in
  the ``normalize`` config, on the GPU in the ``gpu`` config);
* ``ThreadDataLoader``: the frame kernel in worker threads;
* ``ThreadDataLoader, processes``: the same, the threads spread over
  ``worker_processes=P`` child processes (only where ThreadDataLoader has
  that keyword).

Configurations (each adds one stage to the last): ``resize`` (decode +
resize, one sample at a time), ``batch`` (+ batching), ``normalize`` (+ float
conversion and normalization), ``gpu`` (+ transfer to the GPU).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Iterable
from typing import Any, Callable

import torch

from threadloader.io import decode_image

__all__ = [
    "ALL_LOADERS",
    "BASELINE",
    "CONFIGS",
    "Cycle",
    "FrameLoader",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "KERNEL_BOUND",
    "LOADERS",
    "PROCESS_KERNEL",
    "THREADS",
    "THREADS_IN_PROCESSES",
    "build_loader",
    "frame_dataset",
    "import_torchvision",
    "supports_worker_processes",
    "torchvision_dataset",
    "worker_processes_for",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: Configuration key -> label printed in tables and plots.
CONFIGS: dict[str, str] = {
    "resize": "1 decode+resize",
    "batch": "2 +batching",
    "normalize": "3 +normalize",
    "gpu": "4 +gpu transfer",
}

BASELINE = "DataLoader"
PROCESS_KERNEL = "DataLoader + kernel"
THREADS = "ThreadDataLoader"
THREADS_IN_PROCESSES = "ThreadDataLoader, processes"
#: Not a loader: the frame kernel alone in min(workers, cores) processes at once (bench/kernel_bound.py).
KERNEL_BOUND = "kernel bound"

#: The two loaders compared by default (run_comparison's default).
LOADERS = (BASELINE, THREADS)
#: Every loader the main job can run, in table order.
ALL_LOADERS = (BASELINE, PROCESS_KERNEL, THREADS, THREADS_IN_PROCESSES)


def import_torchvision() -> Any:
    """torchvision, which the bench's baseline and ImageFolder need.

    Raises:
        ImportError: with a one-line hint when it is missing or does not import
            beside this torch (torchvision is not a dependency of the library).
    """
    try:
        import torchvision
    except Exception as e:  # noqa: BLE001 - a torchvision built for another torch raises RuntimeError/OSError
        raise ImportError(
            f"the bench needs torchvision (its DataLoader baseline and ImageFolder) and it did not import "
            f"({type(e).__name__}: {e}); install the build matching torch {torch.__version__}, "
            f"e.g. pip install 'threadloader[bench]'"
        ) from e
    return torchvision


def supports_worker_processes() -> bool:
    """Whether this ThreadDataLoader takes ``worker_processes`` (threads spread over processes)."""
    from threadloader import ThreadDataLoader

    return "worker_processes" in inspect.signature(ThreadDataLoader).parameters


def worker_processes_for(workers: int, requested: int | None = None) -> int:
    """P for ``workers`` threads: ``requested``, else one process per 4 threads (at least 1), at most ``workers``."""
    return max(1, min(workers, requested if requested else workers // 4))


class FrameLoader:
    """ImageFolder ``loader`` that decodes straight to a resized :class:`~threadloader.Frame`.

    A class rather than a lambda so that data sets using it stay picklable.

    Args:
        size: output size.
        eager: resize in the loader. Without batching nothing collates the
            frame, so its pending resize would run only when the training
            loop reads it; the ``resize`` config must time the resize in the
            worker, as the baseline's ``Resize`` runs there.
    """

    def __init__(self, size: int | tuple[int, int] = 224, eager: bool = False) -> None:
        self.size = size
        self.eager = eager

    def __call__(self, path: str) -> Any:
        frame = decode_image(path, size=self.size)
        if self.eager:
            frame.numpy()  # runs the pending resize now, in the worker
        return frame


def _hw(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def torchvision_dataset(
    root: str | os.PathLike[str], size: int | tuple[int, int], normalize: bool,
    is_valid_file: Callable[[str], bool] | None = None,
) -> Any:
    """The classic PIL + torchvision transforms ImageFolder used as the baseline."""
    tv = import_torchvision()
    transforms = tv.transforms
    steps: list[Any] = [transforms.Resize(_hw(size)), transforms.PILToTensor()]
    if normalize:
        steps += [transforms.ConvertImageDtype(torch.float32), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    return tv.datasets.ImageFolder(str(root), transform=transforms.Compose(steps), is_valid_file=is_valid_file)


def frame_dataset(
    root: str | os.PathLike[str], size: int | tuple[int, int],
    is_valid_file: Callable[[str], bool] | None = None, eager: bool = False,
) -> Any:
    """ImageFolder whose samples are ``(Frame, label)`` decoded by :class:`FrameLoader`."""
    tv = import_torchvision()
    return tv.datasets.ImageFolder(str(root), loader=FrameLoader(_hw(size), eager), is_valid_file=is_valid_file)


class Cycle(torch.utils.data.Sampler):
    """``0, 1, ..., n-1, 0, 1, ...`` for ``num_samples`` indices: a timed run longer than the folder.

    Every loader of a comparison reads the same indices in the same order.
    """

    def __init__(self, n: int, num_samples: int) -> None:
        if n < 1 or num_samples < 0:
            raise ValueError(f"Cycle needs n >= 1 and num_samples >= 0, got {n}, {num_samples}")
        self.n, self.num_samples = n, num_samples

    def __iter__(self) -> Any:
        return (i % self.n for i in range(self.num_samples))

    def __len__(self) -> int:
        return self.num_samples


def _move(loader: Iterable[Any], device: str) -> Iterable[Any]:
    # The baseline's transfer: what a training loop does with a pinned batch.
    for images, labels in loader:
        yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


class _Moved:
    """Iterable + len() around :func:`_move` (each ``iter`` starts a new epoch)."""

    def __init__(self, loader: Any, device: str) -> None:
        self.loader, self.device = loader, device

    def __iter__(self) -> Any:
        return _move(self.loader, self.device)

    def __len__(self) -> int:
        return len(self.loader)


def build_loader(
    loader: str,
    config: str,
    root: str | os.PathLike[str],
    *,
    workers: int,
    batch_size: int = 32,
    size: int | tuple[int, int] = 224,
    device: str = "cuda",
    worker_processes: int | None = None,
    is_valid_file: Callable[[str], bool] | None = None,
    num_samples: int | None = None,
) -> Iterable[Any]:
    """Build the iterable for one (loader, config) cell of the comparison.

    Args:
        loader: one of :data:`ALL_LOADERS`.
        config: a key of :data:`CONFIGS`.
        root: ImageFolder-style root.
        workers: ``num_workers`` (processes or threads).
        batch_size: batch size for the batching configs.
        size: output image size.
        device: device for the ``gpu`` config.
        worker_processes: P for :data:`THREADS_IN_PROCESSES` (default
            :func:`worker_processes_for`).
        is_valid_file: ImageFolder's filter (e.g. to skip unreadable files).
        num_samples: samples to draw, cycling over the folder when it holds
            fewer (None: one pass over it).

    Returns:
        An iterable of samples (``resize``) or batches.

    Raises:
        ValueError: on an unknown loader or config, or ``THREADS_IN_PROCESSES``
            where ThreadDataLoader has no ``worker_processes``.
    """
    if config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}; choose from {', '.join(CONFIGS)}")
    if loader not in ALL_LOADERS:
        raise ValueError(f"unknown loader {loader!r}; choose from {', '.join(ALL_LOADERS)}")
    if loader == THREADS_IN_PROCESSES and not supports_worker_processes():
        raise ValueError("this ThreadDataLoader has no worker_processes keyword")
    batched = config != "resize"
    gpu = config == "gpu"
    batching: dict[str, Any] = {"batch_size": batch_size if batched else None}
    if loader == BASELINE:
        ds = torchvision_dataset(root, size, normalize=config in ("normalize", "gpu"), is_valid_file=is_valid_file)
        if num_samples is not None:
            batching["sampler"] = Cycle(len(ds), num_samples)
        dl = torch.utils.data.DataLoader(ds, num_workers=workers, pin_memory=gpu, **batching)
        return _Moved(dl, device) if gpu else dl

    from threadloader import ThreadDataLoader
    from threadloader.images.device import to_device
    from threadloader.images.frames import frame_collate

    ds = frame_dataset(root, size, is_valid_file=is_valid_file, eager=not batched)
    if num_samples is not None:
        batching["sampler"] = Cycle(len(ds), num_samples)
    if config == "normalize":
        # Normalized in the workers, as part of collate (never on the training loop's thread).
        batching["collate_fn"] = functools.partial(frame_collate, normalize=(IMAGENET_MEAN, IMAGENET_STD))
    elif batched:
        batching["collate_fn"] = frame_collate
    if loader == PROCESS_KERNEL:
        built: Any = torch.utils.data.DataLoader(ds, num_workers=workers, pin_memory=gpu, **batching)
    elif loader == THREADS:
        built = ThreadDataLoader(ds, num_workers=workers, pin_memory=gpu, **batching)
    else:
        built = ThreadDataLoader(
            ds, num_workers=workers, pin_memory=gpu, worker_processes=worker_processes_for(workers, worker_processes),
            **batching,
        )
    if gpu:
        return to_device(built, device, normalize=(IMAGENET_MEAN, IMAGENET_STD))
    return built
