"""Tests for threadloader.images.device (the to_device stage)."""

from __future__ import annotations

import collections

import pytest
import torch
from helpers import require_torchvision

from threadloader.images.device import DeviceLoader, ImageTransform, to_device

v2 = require_torchvision("transforms.v2")  # the reference transforms; skips this module without it
F = v2.functional

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _images(n: int = 4, c: int = 3, h: int = 5, w: int = 7, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g)


def _reference(x: torch.Tensor, flips: torch.Tensor | None = None) -> torch.Tensor:
    ref = v2.Normalize(MEAN, STD)(v2.ToDtype(torch.float32, scale=True)(x))
    if flips is not None:
        ref = ref.clone()
        for i in flips.tolist():
            ref[i] = F.horizontal_flip(ref[i])
    return ref


def test_normalize_matches_torchvision() -> None:
    x = _images()
    (out,) = list(to_device([x], "cpu", normalize=(MEAN, STD)))
    assert out.dtype == torch.float32 and out.shape == x.shape
    torch.testing.assert_close(out, _reference(x), rtol=1e-5, atol=1e-5)
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_no_normalize_scales_to_unit_range() -> None:
    x = _images()
    (out,) = list(to_device([x], "cpu", channels_last=False))
    torch.testing.assert_close(out, x.float() / 255)
    assert out.is_contiguous()


def test_channels_last_input_view_is_supported() -> None:
    # frame_collate returns an (N, C, H, W) channels-last view of an NHWC buffer.
    nhwc = _images().permute(0, 2, 3, 1).contiguous()
    x = nhwc.permute(0, 3, 1, 2)
    (out,) = list(to_device([x], "cpu", normalize=(MEAN, STD)))
    torch.testing.assert_close(out, _reference(x.contiguous()), rtol=1e-5, atol=1e-5)


def test_many_image_widths_keep_a_bounded_cache_and_exact_values() -> None:
    # Images at their native widths: the CPU path's per-width coefficient rows are a bounded cache.
    transform = ImageTransform(normalize=(MEAN, STD), channels_last=True)
    for w in range(3, 60):
        x = _images(n=2, w=w, seed=w)
        torch.testing.assert_close(transform(x), _reference(x), rtol=1e-5, atol=1e-5)
        assert len(transform._rows) <= 16


def test_mirror_matches_hflip_per_sample() -> None:
    x = _images(n=16)
    g = torch.Generator().manual_seed(3)
    expected_flips = (torch.rand(16, generator=torch.Generator().manual_seed(3)) < 0.5).nonzero().flatten()
    assert 0 < expected_flips.numel() < 16  # the seed mixes flipped and kept samples
    (out,) = list(to_device([x], "cpu", normalize=(MEAN, STD), mirror=0.5, generator=g))
    torch.testing.assert_close(out, _reference(x, expected_flips), rtol=1e-5, atol=1e-5)


def test_mirror_extremes_and_uint8_passthrough() -> None:
    x = _images()
    (always,) = list(to_device([x], "cpu", mirror=1.0, dtype=None))
    assert always.dtype == torch.uint8
    assert torch.equal(always, x.flip(-1))
    assert not torch.equal(x, x.flip(-1))  # the input itself is never modified
    (never,) = list(to_device([x], "cpu", mirror=0.0, dtype=None))
    assert torch.equal(never, x)


def test_seeded_generator_is_reproducible() -> None:
    batches = [_images(seed=i) for i in range(3)]

    def run() -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(11)
        return list(to_device(batches, "cpu", mirror=0.5, generator=g))

    for a, b in zip(run(), run()):
        assert torch.equal(a, b)


def test_structure_handling() -> None:
    Pair = collections.namedtuple("Pair", "image label")
    x = _images()
    labels = torch.arange(4)
    mask = torch.zeros(4, 5, 7, dtype=torch.uint8)  # 3-D uint8: not an image batch
    batches = [
        (x, labels),
        [x, labels, "meta"],
        {"image": x, "label": labels, "mask": mask, "names": ["a", "b"]},
        Pair(x, labels),
        x,
    ]
    outs = list(to_device(batches, "cpu", normalize=(MEAN, STD)))
    ref = _reference(x)
    assert isinstance(outs[0], tuple)
    torch.testing.assert_close(outs[0][0], ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(outs[0][1], labels)
    assert isinstance(outs[1], list) and outs[1][2] == "meta"
    assert isinstance(outs[2], dict)
    assert outs[2]["mask"].dtype == torch.uint8 and torch.equal(outs[2]["mask"], mask)
    assert outs[2]["names"] == ["a", "b"]
    torch.testing.assert_close(outs[2]["image"], ref, rtol=1e-5, atol=1e-5)
    assert isinstance(outs[3], Pair) and outs[3].label is not None
    torch.testing.assert_close(outs[4], ref, rtol=1e-5, atol=1e-5)


class _Views(collections.abc.Sequence):
    """A read-only Sequence batch type, as a user's collate_fn may return."""

    def __init__(self, items) -> None:
        self._items = list(items)

    def __getitem__(self, k):
        return self._items[k]

    def __len__(self) -> int:
        return len(self._items)


class _Tagged(dict):
    """A dict subclass with an attribute of its own."""


def test_containers_keep_their_type_as_in_torchs_pin_memory() -> None:
    x = _images()
    tagged = _Tagged(image=x)
    tagged.source = "train"
    batches = [_Views([x, "meta"]), collections.defaultdict(list, image=x), tagged, [x, range(2)]]
    outs = list(to_device(batches, "cpu", normalize=(MEAN, STD)))
    ref = _reference(x)
    assert type(outs[0]) is _Views and outs[0][1] == "meta"
    torch.testing.assert_close(outs[0][0], ref, rtol=1e-5, atol=1e-5)  # walked into, not skipped
    assert type(outs[1]) is collections.defaultdict and outs[1].default_factory is list
    torch.testing.assert_close(outs[1]["image"], ref, rtol=1e-5, atol=1e-5)
    assert type(outs[2]) is _Tagged and outs[2].source == "train"
    torch.testing.assert_close(outs[2]["image"], ref, rtol=1e-5, atol=1e-5)
    assert outs[3][1] == [0, 1]  # a range cannot be rebuilt: a list, as pin_memory makes it
    assert type(batches[1]["image"]) is torch.Tensor and batches[1]["image"].dtype == torch.uint8  # input kept


class _Store(collections.abc.MutableMapping):
    """A mapping that keeps its items in an attribute: a shallow copy would share them."""

    def __init__(self, items=(), **kw) -> None:
        self._store = dict(items, **kw)

    def __getitem__(self, k):
        return self._store[k]

    def __setitem__(self, k, v) -> None:
        self._store[k] = v

    def __delitem__(self, k) -> None:
        del self._store[k]

    def __iter__(self):
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)


def test_the_loaders_batch_is_never_changed() -> None:
    x = _images()
    batch = _Store(image=x)
    (out,) = list(to_device([batch], "cpu", normalize=(MEAN, STD)))
    assert batch["image"] is x  # the loader's batch (a dataset's sample with batch_size=None) is left alone
    assert type(out) is _Store and out["image"].dtype == torch.float32


def test_paired_images_share_flips() -> None:
    x = _images(n=8)
    (a, b) = next(iter(to_device([(x, x.clone())], "cpu", mirror=0.5, dtype=None)))
    assert torch.equal(a, b)


def test_len_and_attribute_delegation() -> None:
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=3)
    wrapped = to_device(loader, "cpu")
    assert isinstance(wrapped, DeviceLoader)
    assert len(wrapped) == 4
    assert wrapped.batch_size == 3
    assert [b.tolist() for b in wrapped] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    with pytest.raises(TypeError):
        len(to_device(iter([1]), "cpu"))


def test_works_with_loader_of_uint8_images() -> None:
    data = [(_images(n=1, seed=i)[0], i) for i in range(6)]
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    outs = list(to_device(loader, "cpu", normalize=(MEAN, STD)))
    assert [o[0].shape[0] for o in outs] == [4, 2]
    assert outs[0][0].dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs",
    [
        {"normalize": (MEAN, STD[:2])},
        {"normalize": ((), ())},
        {"normalize": (MEAN, (0.2, 0.0, 0.2))},
        {"normalize": "imagenet"},
        {"normalize": (MEAN, STD), "dtype": None},
        {"mirror": 1.5},
        {"mirror": -0.1},
        {"mirror": True},
        {"dtype": torch.int32},
        {"prefetch": 0},
        {"generator": 3},
    ],
)
def test_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        to_device([], "cpu", **kwargs)


def test_bad_loader_device_and_channels() -> None:
    with pytest.raises(TypeError):
        to_device(3, "cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        to_device([], "not-a-device")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):
            to_device([], "cuda")
    with pytest.raises(ValueError, match="channels"):
        list(to_device([_images(c=4)], "cpu", normalize=(MEAN, STD)))


def test_single_value_normalize_broadcasts() -> None:
    x = _images(c=1)
    (out,) = list(to_device([x], "cpu", normalize=((0.5,), (0.5,))))
    torch.testing.assert_close(out, (x.float() / 255 - 0.5) / 0.5, rtol=1e-5, atol=1e-5)


def test_half_precision_dtype() -> None:
    x = _images()
    (out,) = list(to_device([x], "cpu", normalize=(MEAN, STD), dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _reference(x), rtol=2e-2, atol=2e-2)


def test_transform_rejects_non_images() -> None:
    with pytest.raises(ValueError):
        ImageTransform()(torch.zeros(2, 3, 4))


# ----------------------------------------------------------------------------- CUDA


@cuda
def test_cuda_values_equal_cpu_path() -> None:
    batches = [(_images(n=8, h=32, w=48, seed=i), torch.arange(8)) for i in range(5)]

    def run(device: str) -> list:
        g = torch.Generator().manual_seed(5)
        return list(to_device(batches, device, normalize=(MEAN, STD), mirror=0.5, generator=g))

    for (gx, gl), (cx, cl) in zip(run("cuda"), run("cpu")):
        assert gx.device.type == "cuda" and gl.device.type == "cuda"
        torch.testing.assert_close(gx.cpu(), cx, rtol=1e-5, atol=1e-5)
        assert torch.equal(gl.cpu(), cl)


@cuda
def test_cuda_non_blocking_from_pinned_loader() -> None:
    data = [(_images(n=1, h=64, w=64, seed=i)[0], i) for i in range(20)]
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    outs = list(to_device(loader, "cuda", normalize=(MEAN, STD), prefetch=3))
    assert len(outs) == 5
    ref = _reference(torch.stack([d[0] for d in data]))
    got = torch.cat([o[0].cpu() for o in outs])
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@cuda
def test_cuda_pinned_buffer_not_released_before_copy() -> None:
    """A pooled pinned buffer is overwritten as soon as the wrapper lets go of it.

    The source loader reuses one pinned buffer and refills it only when the
    previous batch object has been garbage collected (as a pool keyed on
    release would). If the wrapper released the host batch before its copy
    finished, the device data would be corrupted.
    """
    import gc
    import weakref

    n, h, w = 8, 256, 256
    expected = [_images(n=n, h=h, w=w, seed=i) for i in range(6)]

    class PoolLoader:
        def __iter__(self):
            buf = torch.empty((n, 3, h, w), dtype=torch.uint8).pin_memory()
            alive: list = []
            for x in expected:
                gc.collect()
                if alive and alive[0]() is not None:
                    # Still referenced: a pool would allocate a fresh buffer.
                    buf = torch.empty((n, 3, h, w), dtype=torch.uint8).pin_memory()
                buf.copy_(x)
                view = buf[:]
                alive[:] = [weakref.ref(view)]
                yield view

    # Slow the copy stream's consumer down so copies are still in flight.
    outs = []
    for out in to_device(PoolLoader(), "cuda", dtype=None, prefetch=2):
        torch.cuda._sleep(10_000_000)
        outs.append(out)
    torch.cuda.synchronize()
    for got, x in zip(outs, expected):
        assert torch.equal(got.cpu(), x)


@cuda
def test_cuda_break_early_is_safe() -> None:
    batches = [_images(n=4, h=64, w=64, seed=i).pin_memory() for i in range(10)]
    it = iter(to_device(batches, "cuda", normalize=(MEAN, STD)))
    first = next(it)
    del it
    torch.cuda.synchronize()
    torch.testing.assert_close(first.cpu(), _reference(batches[0]), rtol=1e-5, atol=1e-5)


class _FailsAt(torch.utils.data.Dataset):
    """Indices 2 and 3 (the second batch of 2) raise in the worker; the others are small uint8 images."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in (2, 3):
            raise ValueError(f"bad sample {i}")
        return torch.full((3, 2, 2), i, dtype=torch.uint8)


def _outcomes(iterable, first_value) -> list:
    out, it = [], iter(iterable)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return out
        except ValueError:
            out.append("error")
            continue
        out.append(first_value(batch))


def test_a_loader_error_is_raised_and_the_epoch_goes_on() -> None:
    # As with the loader itself (and DataLoader): the worker's error is raised
    # for its batch, and the next next() gives the following batch.
    from threadloader import ThreadDataLoader

    def make():
        return ThreadDataLoader(_FailsAt(), batch_size=2, num_workers=2)

    bare = _outcomes(make(), lambda b: int(b[0, 0, 0, 0]))
    moved = _outcomes(to_device(make(), "cpu"), lambda b: round(float(b[0, 0, 0, 0]) * 255))
    assert bare == [0, "error", 4, 6]
    assert moved == bare
