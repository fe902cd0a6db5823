"""Frame and frame_collate: shapes, values and structure match PILToTensor + default_collate."""

from __future__ import annotations

import collections
import pickle
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import default_collate

from threadloader import Frame, frame_collate
from threadloader._platform import torch_compat as _torch_compat
from threadloader.images import decode as _image  # noqa: F401 - installs the native resize
from threadloader.images import frames as _frames_module
from threadloader.images.frames import _deferred
from threadloader.worker.context import set_collating

Point = collections.namedtuple("Point", "image label")


def _frame(h: int = 6, w: int = 5, seed: int = 0) -> Frame:
    return Frame(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_frame_basics() -> None:
    arr = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    f = Frame(arr)
    assert (f.height, f.width, f.channels, f.layout, f.shape) == (4, 5, 3, "HWC", (4, 5, 3))
    assert f.numpy() is arr
    assert np.asarray(f) is arr
    t = f.to_tensor()
    assert t.shape == (3, 4, 5) and t.dtype == torch.uint8
    assert torch.equal(t, torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous())
    assert "height=4" in repr(f) and "width=5" in repr(f) and "HWC" in repr(f)
    assert not hasattr(f, "__dict__")
    g = pickle.loads(pickle.dumps(f))
    assert np.array_equal(g.numpy(), arr)


@pytest.mark.parametrize("dtype", [None, np.uint8, np.float32, "int16"])
@pytest.mark.parametrize("copy", [None, True, False])
def test_frame_array_protocol_follows_numpy(dtype: object, copy: bool | None) -> None:
    # The frame answers np.asarray/np.array as its own ndarray does.
    arr = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    f = Frame(arr)
    try:
        want = np.array(arr, dtype=dtype, copy=copy)
    except ValueError as e:
        with pytest.raises(ValueError, match=re.escape(str(e).splitlines()[0])):
            np.array(f, dtype=dtype, copy=copy)
        return
    got = np.array(f, dtype=dtype, copy=copy)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.shares_memory(got, arr) == np.shares_memory(want, arr)


def test_frame_rejects_bad_arrays() -> None:
    with pytest.raises(TypeError):
        Frame(np.zeros((2, 2, 3), dtype=np.float32))
    with pytest.raises(ValueError):
        Frame(np.zeros((2, 2), dtype=np.uint8))


def test_to_tensor_of_read_only_array_copies() -> None:
    arr = np.zeros((2, 3, 3), dtype=np.uint8)
    arr.flags.writeable = False
    t = Frame(arr).to_tensor()
    assert t.shape == (3, 2, 3)


@pytest.mark.parametrize("view", [np.s_[..., ::-1], np.s_[::-1], np.s_[:, ::-1]])
def test_to_tensor_of_a_flipped_view_copies(view) -> None:
    # OpenCV's BGR -> RGB ``[..., ::-1]``: negative strides, which torch.from_numpy refuses.
    arr = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    t = Frame(arr[view]).to_tensor()
    assert torch.equal(t, torch.from_numpy(arr[view].copy()).permute(2, 0, 1))
    assert torch.equal(frame_collate([Frame(arr[view])])[0], t)


def test_collate_equals_pil_to_tensor_default_collate() -> None:
    frames = [_frame(seed=i) for i in range(4)]
    out = frame_collate(frames)
    ref = default_collate([f.to_tensor().contiguous() for f in frames])
    assert out.shape == ref.shape == (4, 3, 6, 5) and out.dtype == torch.uint8
    assert torch.equal(out, ref)
    assert out.is_contiguous(memory_format=torch.channels_last)
    # One (N, H, W, C) buffer behind the view.
    assert out.permute(0, 2, 3, 1).is_contiguous()


def test_collate_copies_frames() -> None:
    frames = [_frame(seed=i) for i in range(2)]
    out = frame_collate(frames)
    frames[0].numpy()[:] = 0
    assert out[0].sum() > 0


def test_collate_nested_structures() -> None:
    batch = [
        {"img": _frame(seed=i), "meta": (i, torch.tensor([i, i + 1.0])), "tag": f"s{i}",
         "pt": Point(_frame(seed=10 + i), i), "lst": [_frame(seed=20 + i), 0.5 * i]}
        for i in range(3)
    ]
    out = frame_collate(batch)

    def to_ref(x):
        if isinstance(x, Frame):
            return x.to_tensor().contiguous()
        if isinstance(x, dict):
            return {k: to_ref(v) for k, v in x.items()}
        if isinstance(x, Point):
            return Point(*(to_ref(v) for v in x))
        if isinstance(x, (list, tuple)):
            return type(x)(to_ref(v) for v in x)
        return x

    ref = default_collate([to_ref(s) for s in batch])
    assert set(out) == set(ref)
    assert torch.equal(out["img"], ref["img"])
    assert torch.equal(out["meta"][0], ref["meta"][0])
    assert torch.equal(out["meta"][1], ref["meta"][1])
    assert out["tag"] == ref["tag"] == ["s0", "s1", "s2"]
    assert isinstance(out["pt"], Point)
    assert torch.equal(out["pt"].image, ref["pt"].image) and torch.equal(out["pt"].label, ref["pt"].label)
    assert torch.equal(out["lst"][0], ref["lst"][0]) and torch.equal(out["lst"][1], ref["lst"][1])


def test_collate_tuples_like_imagefolder() -> None:
    out = frame_collate([(_frame(seed=i), i) for i in range(5)])
    assert isinstance(out, list) and out[0].shape == (5, 3, 6, 5)
    assert torch.equal(out[1], torch.arange(5))


def test_collate_mixed_sizes_error_names_both_sizes() -> None:
    with pytest.raises(ValueError) as info:
        frame_collate([_frame(6, 5), _frame(6, 5), _frame(7, 5)])
    msg = str(info.value)
    assert "6x5" in msg and "7x5" in msg and "sample 2" in msg and "size=" in msg


def test_collate_mixed_types_error() -> None:
    with pytest.raises(TypeError):
        frame_collate([_frame(), torch.zeros(3, 6, 5, dtype=torch.uint8)])
    # An array first picks torch's array handler: the error still names the mix.
    with pytest.raises(TypeError, match="mixes Frame with ndarray at position 0"):
        frame_collate([(np.zeros((6, 5, 3), np.uint8), 0), (_frame(), 1)])
    # Arrays alone collate as default_collate does.
    arrays = [np.full((2, 3), i, np.int64) for i in range(3)]
    assert torch.equal(frame_collate(arrays), default_collate(arrays))


def test_collate_empty_batch_behaves_like_default_collate() -> None:
    with pytest.raises(type(_raises(default_collate, []))):
        frame_collate([])


def _raises(fn, arg):
    try:
        fn(arg)
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("expected an error")


def test_collate_without_frames_is_default_collate() -> None:
    batch = [(torch.ones(2) * i, i, {"a": float(i)}) for i in range(3)]
    out, ref = frame_collate(batch), default_collate(batch)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1]) and torch.equal(out[2]["a"], ref[2]["a"])


def test_collate_not_pinned_by_default() -> None:
    assert not frame_collate([_frame()]).is_pinned()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA for pinned memory")
def test_collate_allocates_pinned_when_requested() -> None:
    set_collating(True)
    try:
        out = frame_collate([_frame(seed=i) for i in range(3)])
    finally:
        set_collating(False)
    assert out.is_pinned()
    assert torch.equal(out, default_collate([_frame(seed=i).to_tensor().contiguous() for i in range(3)]))


# --- pending resize: decode_image(size=...) resizes straight into the batch --------

def _jpeg(h: int, w: int, seed: int) -> bytes:
    from threadloader.images._codec import jpeg
    from threadloader.images.datagen import photo_like_image

    return jpeg.encode_jpeg(np.ascontiguousarray(photo_like_image(h, w, seed)), quality=90)


def _resized_as_before(decoded: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    # What decode_image returned before frames deferred the resize: torch's
    # uint8 kernel into a fresh (1, h, w, C) tensor.
    from threadloader._platform.torch_compat import resize_uint8_channels_last

    out = torch.empty((1, *size, decoded.shape[2]), dtype=torch.uint8)
    resize_uint8_channels_last(torch.from_numpy(decoded).unsqueeze(0), size, out)
    return out[0].numpy()


@pytest.mark.parametrize("size,crop,gap", [((224, 224), None, 2.0), ((40, 70), None, 1.0),
                                           ((64, 48), (10, 30, 200, 150), 2.0), ((33, 33), (0, 0, 375, 500), None)])
def test_pending_resize_pixels_identical_everywhere(size, crop, gap) -> None:
    from threadloader.io import decode_image

    data = [_jpeg(375, 500, seed) for seed in range(3)]
    frames = [decode_image(d, size=size, crop=crop, reducing_gap=gap) for d in data]
    decoded = [f._state[0] for f in frames]
    assert all(f._state[1] == size for f in frames)  # the resize is pending
    assert all(f.shape == (*size, 3) and (f.height, f.width, f.channels) == (*size, 3) for f in frames)
    assert all(f._state[1] == size for f in frames)  # shape did not run it
    want = [_resized_as_before(a, size) for a in decoded]
    batch = frame_collate(frames)
    for i, w in enumerate(want):
        assert np.array_equal(batch[i].permute(1, 2, 0).numpy(), w)
    # Reading a frame after collating resizes it (once) into its own array.
    for f, w in zip(frames, want):
        assert np.array_equal(f.numpy(), w) and f.numpy() is f.numpy()
        assert f._state[1] is None and f.numpy().flags.writeable
        assert torch.equal(f.to_tensor(), torch.from_numpy(w).permute(2, 0, 1))


def test_pending_frame_reads_pickles_and_converts_like_a_plain_frame() -> None:
    from threadloader.io import decode_image

    data = _jpeg(120, 90, 1)
    want = _resized_as_before(decode_image(data).numpy(), (50, 40))
    assert np.array_equal(np.asarray(decode_image(data, size=(50, 40))), want)
    assert np.array_equal(np.array(decode_image(data, size=(50, 40)), dtype=np.float32), want.astype(np.float32))
    assert torch.equal(decode_image(data, size=(50, 40)).to_tensor(), torch.from_numpy(want).permute(2, 0, 1))
    g = pickle.loads(pickle.dumps(decode_image(data, size=(50, 40))))
    assert g._state[1] is None and np.array_equal(g.numpy(), want)
    assert repr(decode_image(data, size=(50, 40))) == "Frame(height=50, width=40, channels=3, layout='HWC')"
    # Same size as decoded: nothing pending.
    assert decode_image(data, size=(120, 90))._state[1] is None


def test_pending_frame_materialised_by_many_threads_at_once() -> None:
    import concurrent.futures

    from threadloader.io import decode_image

    data = _jpeg(200, 160, 2)
    want = _resized_as_before(decode_image(data).numpy(), (64, 64))
    for _ in range(5):
        frame = decode_image(data, size=(64, 64))
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            results = list(ex.map(lambda _: frame.numpy().copy(), range(8)))
        assert all(np.array_equal(r, want) for r in results)
        assert np.array_equal(frame.numpy(), want)


def test_collate_mixes_pending_and_plain_frames_and_checks_pending_sizes() -> None:
    from threadloader.io import decode_image

    data = _jpeg(100, 80, 3)
    plain = Frame(_resized_as_before(decode_image(data).numpy(), (30, 20)))
    pending = decode_image(data, size=(30, 20))
    out = frame_collate([plain, pending, plain])
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])
    err = _raises(frame_collate, [pending, decode_image(data, size=(30, 21))])
    assert isinstance(err, ValueError) and "30x20" in str(err) and "30x21" in str(err)


# --- batch buffers from a pool ------------------------------------------------------

def test_held_batch_and_its_views_never_overwritten_then_reused() -> None:
    import gc

    from threadloader.images.buffers import host_pool

    host_pool.clear()
    held = frame_collate([Frame(np.full((8, 6, 3), 7, np.uint8)) for _ in range(4)])
    ptr = held.data_ptr()
    view = held[1:3]          # a torch view
    arr = held.numpy()[0]     # a numpy view of the batch
    for i in range(50):       # many more batches, each dropped at once
        b = frame_collate([Frame(np.full((8, 6, 3), i % 7, np.uint8)) for _ in range(4)])
        assert b.data_ptr() != ptr
        del b
    assert torch.all(held == 7) and torch.all(view == 7) and np.all(arr == 7)
    del held
    gc.collect()
    for i in range(5):
        b = frame_collate([Frame(np.full((8, 6, 3), 9, np.uint8)) for _ in range(4)])
        assert b.data_ptr() != ptr, "reused while a view was alive"
        del b
    assert torch.all(view == 7) and np.all(arr == 7)
    del view
    for i in range(5):
        b = frame_collate([Frame(np.full((8, 6, 3), 1, np.uint8)) for _ in range(4)])
        assert b.data_ptr() != ptr, "reused while a numpy view was alive"
        del b
    assert np.all(arr == 7)
    del arr
    reused = frame_collate([Frame(np.full((8, 6, 3), 3, np.uint8)) for _ in range(4)])
    assert reused.data_ptr() == ptr, "the released buffer was not reused"
    assert torch.all(reused == 3)


def test_pool_is_bounded_and_handles_shape_changes() -> None:
    from threadloader.images.buffers import BufferPool

    pool = BufferPool(slack=3)
    held = [pool.take((5, 7), torch.uint8) for _ in range(10)]
    assert pool.stats()["lent"] == 10
    del held
    assert pool.stats() == {"lent": 0, "free": 3, "free_bytes": 3 * 35, "reserved": 0}
    a = pool.take((7, 5), torch.uint8)    # same bytes, another shape: reused
    b = pool.take((35,), torch.float32)   # another size: new memory
    assert a.shape == (7, 5) and b.shape == (35,) and b.dtype == torch.float32
    assert pool.stats()["free"] == 2
    b.fill_(1.5)
    assert torch.all(b == 1.5)
    del a, b
    assert pool.stats()["free"] == 3  # the oldest went back to the allocator
    with pytest.raises(ValueError):
        BufferPool(slack=-1)


def test_a_free_block_no_loan_matches_for_long_goes_back() -> None:
    # One odd size (a huge image decoded once) stayed in the free list for
    # ever beside a steady working set of other sizes.
    from threadloader.images.buffers import BufferPool

    pool = BufferPool(slack=4)
    pool.take((1000,), torch.uint8)  # the odd one, given back at once
    for _ in range(pool._idle_limit()):
        pool.take((16,), torch.uint8)  # the working set: one block, reused
    assert pool.stats()["free_bytes"] == 1000 + 16
    pool.take((16,), torch.uint8)
    assert pool.stats() == {"lent": 0, "free": 1, "free_bytes": 16, "reserved": 0}


def test_pool_reservation_keeps_more_free_blocks_until_released() -> None:
    from threadloader.images.buffers import BufferPool

    pool = BufferPool(slack=1)
    first = pool.reserve(3)
    second = pool.reserve(2)
    held = [pool.take((16,), torch.uint8) for _ in range(10)]
    del held
    assert pool.stats() == {"lent": 0, "free": 6, "free_bytes": 6 * 16, "reserved": 5}
    first()
    assert pool.stats()["free"] == 3 and pool.stats()["reserved"] == 2  # trimmed at once, oldest first
    first()  # idempotent
    assert pool.stats()["reserved"] == 2
    second()
    assert pool.stats() == {"lent": 0, "free": 1, "free_bytes": 16, "reserved": 0}
    with pytest.raises(ValueError, match="blocks must be >= 0"):
        pool.reserve(-1)


@pytest.mark.parametrize("persistent", [False, True])
def test_running_loader_reserves_its_working_set_and_releases_it(persistent: bool) -> None:
    """While an iterator runs, the pools keep its in-flight depth; afterwards, only their base slack."""
    from threadloader import ThreadDataLoader
    from threadloader.images.buffers import decode_pool, host_pool

    class Frames(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 24

        def __getitem__(self, i: int) -> Frame:
            return Frame(np.full((4, 5, 3), i, np.uint8))

    base = (host_pool.stats()["reserved"], decode_pool.stats()["reserved"])
    loader = ThreadDataLoader(Frames(), batch_size=4, num_workers=2, prefetch_factor=3,
                              collate_fn=frame_collate, persistent_workers=persistent)
    it = iter(loader)
    batches = [next(it) for _ in range(2)]
    assert host_pool.stats()["reserved"] == base[0] + 3 * 2 + 1  # in flight + the one held
    assert decode_pool.stats()["reserved"] == base[1] + 2 * 4 + 3 * 2  # each thread's batch of frames + in flight
    assert [int(b[0, 0, 0, 0]) for b in batches] == [0, 4]
    it._shutdown_workers()
    assert (host_pool.stats()["reserved"], decode_pool.stats()["reserved"]) == base
    assert host_pool.stats()["free"] <= host_pool.slack + base[0]


def test_worker_process_threads_reserve_their_frames_in_the_childs_pool() -> None:
    from threadloader import ThreadDataLoader
    from threadloader.images.buffers import decode_pool, host_pool

    base = (host_pool.stats()["reserved"], decode_pool.stats()["reserved"])
    loader = ThreadDataLoader(ReservedInChild(), batch_size=3, num_workers=2, worker_processes=1)
    batches = list(loader)
    # In the child, each thread holds room for its 3 frames (the other thread's
    # may not be there yet when the first sample is fetched); none in the
    # parent, which decodes nothing.
    assert all(3 <= v <= 2 * 3 for b in batches for v in b.tolist()), batches
    assert (host_pool.stats()["reserved"], decode_pool.stats()["reserved"]) == base


class ReservedInChild(torch.utils.data.Dataset):
    """Each sample: the decode pool's reservation where it is fetched."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> int:
        from threadloader.images.buffers import decode_pool

        return decode_pool.stats()["reserved"]


def test_pool_under_concurrent_threads_never_lends_a_buffer_twice() -> None:
    import concurrent.futures

    from threadloader.images.buffers import BufferPool

    pool = BufferPool(slack=2)

    def work(k: int) -> bool:
        ok = True
        kept = []
        for i in range(200):
            t = pool.take((64,), torch.int64)
            t.fill_(k * 1000 + i)
            kept.append((t, k * 1000 + i))
            if len(kept) > 3:
                old, v = kept.pop(0)
                ok &= bool(torch.all(old == v))
        return ok and all(bool(torch.all(t == v)) for t, v in kept)

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        assert all(ex.map(work, range(8)))
    assert pool.stats()["lent"] == 0 and pool.stats()["free"] <= 2


def test_thread_loader_batches_held_by_the_user_stay_intact() -> None:
    from threadloader import ThreadDataLoader

    class Flat(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> Frame:
            return Frame(np.full((8, 6, 3), i, np.uint8))

    loader = ThreadDataLoader(Flat(), batch_size=4, num_workers=2, collate_fn=frame_collate)
    kept = []
    for epoch in range(3):
        for j, batch in enumerate(loader):
            if epoch == 0 and j % 3 == 0:
                kept.append((batch, batch[0], j))
    for batch, first, j in kept:
        assert torch.equal(batch[:, 0, 0, 0], torch.arange(4 * j, 4 * j + 4, dtype=torch.uint8))
        assert torch.all(first == 4 * j)


# --- normalize in the worker --------------------------------------------------------

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_normalize_equals_to_device_cpu_and_the_formula() -> None:
    import functools

    from threadloader import to_device

    frames = [_frame(9, 7, seed=i) for i in range(5)]
    u8 = frame_collate(frames)
    want = next(iter(to_device([u8], "cpu", normalize=(MEAN, STD))))
    got = frame_collate(frames, normalize=(MEAN, STD))
    assert got.dtype == torch.float32 and got.shape == (5, 3, 9, 7)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, want)
    formula = (u8.double() / 255 - torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)) / torch.tensor(
        STD, dtype=torch.float64).view(1, 3, 1, 1)
    assert torch.allclose(got.double(), formula, atol=1e-5)
    # Lists work too, and so does a partial (picklable collate_fn).
    fn = functools.partial(frame_collate, normalize=([*MEAN], [*STD]))
    assert torch.equal(pickle.loads(pickle.dumps(fn))(frames), want)
    scaled = frame_collate(frames, dtype=torch.float64)
    assert torch.equal(scaled, next(iter(to_device([u8], "cpu", dtype=torch.float64))))
    assert torch.allclose(scaled, u8.double() / 255, rtol=0, atol=1e-12)


def test_normalize_with_pending_frames_and_labels() -> None:
    from threadloader.io import decode_image

    data = [_jpeg(90, 120, s) for s in range(3)]
    u8, labels = frame_collate([(decode_image(d, size=(32, 40)), i) for i, d in enumerate(data)])
    got, labels2 = frame_collate([(decode_image(d, size=(32, 40)), i) for i, d in enumerate(data)],
                                 normalize=(MEAN, STD))
    from threadloader.images.device import ImageTransform

    want = torch.empty(u8.shape, dtype=torch.float32).contiguous(memory_format=torch.channels_last)
    ImageTransform(normalize=(MEAN, STD)).normalize_into(u8, want)
    assert torch.equal(got, want) and torch.equal(labels, labels2)


def test_normalize_given_as_tensors_uses_their_current_values_and_keeps_no_copies() -> None:
    from threadloader.images import frames as frames_module

    frames = [_frame(4, 5, seed=1)]
    u8 = frame_collate(frames).double()
    mean, std = torch.tensor(MEAN), torch.tensor(STD)

    def expected() -> torch.Tensor:
        return (u8 / 255 - mean.double().view(1, 3, 1, 1)) / std.double().view(1, 3, 1, 1)

    assert torch.allclose(frame_collate(frames, normalize=(mean, std)).double(), expected(), atol=1e-5)
    mean.fill_(0.5)  # changed in place: the next batch sees the new values
    std.copy_(torch.tensor([0.25, 0.5, 1.0]))
    assert torch.allclose(frame_collate(frames, normalize=(mean, std)).double(), expected(), atol=1e-5)
    # A fresh tensor per batch with the same values (a common way to write
    # it) does not make the cache grow.
    frame_collate(frames, normalize=(torch.tensor(MEAN), torch.tensor(STD)))
    before = len(frames_module._transforms)
    for _ in range(50):
        frame_collate(frames, normalize=(torch.tensor(MEAN), torch.tensor(STD)))
    assert len(frames_module._transforms) == before
    # New values each batch: the cache stays bounded.
    for i in range(3 * frames_module._TRANSFORMS_KEPT):
        frame_collate(frames, normalize=([i / 1000] * 3, STD))
    assert len(frames_module._transforms) <= frames_module._TRANSFORMS_KEPT


def test_normalize_bad_arguments() -> None:
    frames = [_frame()]
    for bad in [((0.5,), (0.0,)), ((0.5, 0.5), (1.0,)), "mean"]:
        with pytest.raises(ValueError):
            frame_collate(frames, normalize=bad)
    with pytest.raises(ValueError, match="channels"):
        frame_collate(frames, normalize=((0.5, 0.5), (1.0, 1.0)))
    with pytest.raises(ValueError):
        frame_collate(frames, dtype=torch.int32)


def test_normalize_runs_in_the_worker_threads() -> None:
    import functools
    import threading

    from threadloader import ThreadDataLoader
    from threadloader.images.device import ImageTransform

    seen: set[str] = set()
    original = ImageTransform.normalize_into

    def spy(self, x, out):
        seen.add(threading.current_thread().name)
        return original(self, x, out)

    frames = [_frame(4, 4, seed=i) for i in range(16)]
    loader = ThreadDataLoader(frames, batch_size=4, num_workers=2,
                              collate_fn=functools.partial(frame_collate, normalize=(MEAN, STD)))
    ImageTransform.normalize_into = spy
    try:
        got = list(loader)
    finally:
        ImageTransform.normalize_into = original
    want = [frame_collate(frames[i:i + 4], normalize=(MEAN, STD)) for i in range(0, 16, 4)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert seen and threading.main_thread().name not in seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA for pinned memory")
def test_normalized_batch_allocated_pinned_when_requested() -> None:
    frames = [_frame(seed=i) for i in range(3)]
    set_collating(True)
    try:
        out = frame_collate(frames, normalize=(MEAN, STD))
    finally:
        set_collating(False)
    assert out.is_pinned() and out.dtype == torch.float32
    assert torch.equal(out, frame_collate(frames, normalize=(MEAN, STD)))


def test_pool_granule_shares_blocks_between_nearby_sizes() -> None:
    from threadloader.images.buffers import BufferPool

    pool = BufferPool(slack=2, granule=1024)
    a = pool.take_bytes(1000)
    assert a.nbytes == 1000 and a.dtype == np.uint8
    ptr = a.ctypes.data
    del a
    b = pool.take_bytes(700)  # same 1 KiB block class: reused
    assert b.ctypes.data == ptr and b.nbytes == 700
    c = pool.take_bytes(1500)  # the next class: new memory
    assert c.ctypes.data != ptr and pool.stats()["lent"] == 2
    with pytest.raises(ValueError):
        BufferPool(granule=0)


def test_decoded_jpegs_reuse_pooled_memory_only_after_release() -> None:
    from threadloader.images._codec import jpeg
    from threadloader.images.buffers import decode_pool
    from threadloader.images.datagen import photo_like_image
    from threadloader.io import decode_image

    pixels = photo_like_image(60, 80, seed=3)
    data = jpeg.encode_jpeg(pixels, quality=90, colorspace="RGB")
    expected = jpeg.decode_jpeg(data, colorspace="RGB")
    first = decode_image(data)
    ptr = first.numpy().ctypes.data
    others = [decode_image(data) for _ in range(5)]  # first is alive: never its block
    assert all(o.numpy().ctypes.data != ptr for o in others)
    assert np.array_equal(first.numpy(), expected)
    lent = decode_pool.stats()["lent"]
    del others
    assert decode_pool.stats()["lent"] == lent - 5
    del first
    again = [decode_image(data) for _ in range(6)]
    assert any(o.numpy().ctypes.data == ptr for o in again), "a released block was not reused"
    assert all(np.array_equal(o.numpy(), expected) for o in again)
    # Pending resizes read the pooled pixels at collate time: still correct.
    batch = frame_collate([decode_image(data, size=(20, 30)) for _ in range(4)])
    single = decode_image(data, size=(20, 30)).to_tensor()
    assert all(torch.equal(batch[i], single) for i in range(4))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_frames_pickle_at_every_protocol(protocol):
    # Protocols 0 and 1 test the state's truth: a bare array state raised
    # (or, for a single zero pixel, was dropped).
    for pixels in (np.arange(18, dtype=np.uint8).reshape(2, 3, 3), np.zeros((1, 1, 1), np.uint8)):
        back = pickle.loads(pickle.dumps(Frame(pixels), protocol=protocol))
        assert isinstance(back, Frame) and np.array_equal(back.numpy(), pixels)


def test_threads_reading_a_pending_frame_at_once_all_get_the_frames_own_array():
    import threading

    from threadloader.images.frames import _deferred

    pixels = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    for _ in range(10):
        frame = _deferred(pixels.copy(), (150, 170))
        barrier, got = threading.Barrier(6), [None] * 6

        def read(i):
            barrier.wait()
            got[i] = frame.numpy()

        threads = [threading.Thread(target=read, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        own = frame.numpy()
        assert all(a is own for a in got)  # each used to keep the array it resized itself



# --- the native batch resize (threadloader/images/_native.c) --------------------------

needs_native_resize = pytest.mark.skipif(_frames_module._native_resize is None,
                                         reason="threadloader.images._native not built or turned off")


def _torch_resize(arr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    out = torch.empty((1, size[0], size[1], 3), dtype=torch.uint8)
    _torch_compat.resize_op(torch.from_numpy(np.ascontiguousarray(arr)[None]).permute(0, 3, 1, 2), size, False,
                            out=out.permute(0, 3, 1, 2))
    return out[0].numpy()


@needs_native_resize
@settings(max_examples=40, deadline=None)
@given(ih=st.integers(1, 600), iw=st.integers(1, 600), oh=st.integers(1, 300), ow=st.integers(1, 300),
       seed=st.integers(0, 2**16), crop=st.booleans(), flat=st.sampled_from([None, 0, 255]))
def test_native_resize_is_torchs_kernel_bit_for_bit(ih, iw, oh, ow, seed, crop, flat) -> None:
    """Down, up, one axis, one pixel, noise (every rounding) or flat extremes (the clamps); rows may be strided."""
    rng = np.random.default_rng(seed)
    full = rng.integers(0, 256, (ih + 3, iw + 5, 3), dtype=np.uint8) if flat is None else \
        np.full((ih + 3, iw + 5, 3), flat, np.uint8)
    arr = full[1:1 + ih, 2:2 + iw] if crop else np.ascontiguousarray(full[:ih, :iw])
    out = np.empty((2, oh, ow, 3), np.uint8)
    out[1] = 7
    _frames_module._native_resize([arr, None], out, oh, ow)
    assert np.array_equal(out[0], _torch_resize(arr, (oh, ow)))
    assert (out[1] == 7).all()  # a None slot is left alone


@needs_native_resize
def test_collate_resizes_a_batch_in_one_native_call(monkeypatch) -> None:
    """Pending and ready frames mixed: one native call, the same batch as torch's op per image."""
    rng = np.random.default_rng(3)
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(60, 80), (24, 32), (33, 47), (24, 32)]]
    frames = [_deferred(arrays[0], (24, 32)), Frame(arrays[1]), _deferred(arrays[2], (24, 32)), Frame(arrays[3])]
    calls = []
    real = _frames_module._native_resize
    monkeypatch.setattr(_frames_module, "_native_resize", lambda *a: calls.append(a) or real(*a))
    batch = frame_collate(frames)
    assert len(calls) == 1
    monkeypatch.setattr(_frames_module, "_native_resize", None)
    frames = [_deferred(arrays[0], (24, 32)), Frame(arrays[1]), _deferred(arrays[2], (24, 32)), Frame(arrays[3])]
    assert torch.equal(batch, frame_collate(frames))
    assert torch.equal(batch[1], torch.from_numpy(arrays[1]).permute(2, 0, 1))


@needs_native_resize
@pytest.mark.parametrize("few_cores", [True, False])
def test_large_sources_go_to_torch_s_kernel_only_on_a_machine_of_few_cores(monkeypatch, few_cores) -> None:
    """Few cores: torch's kernel costs less CPU per large image. Many: one GIL release per batch wins."""
    rng = np.random.default_rng(5)
    side = int(_frames_module._LARGE_SOURCE_PIXELS ** 0.5) + 1
    arrays = [rng.integers(0, 256, (side, side + 3, 3), dtype=np.uint8) for _ in range(2)]
    calls = []
    real = _frames_module._native_resize
    monkeypatch.setattr(_frames_module, "_native_resize", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(_frames_module, "_few_cores", few_cores)
    batch = frame_collate([_deferred(a, (24, 32)) for a in arrays])
    assert len(calls) == (0 if few_cores else 1)
    for got, arr in zip(batch, arrays):
        assert np.array_equal(got.permute(1, 2, 0).numpy(), _torch_resize(arr, (24, 32)))
    calls.clear()
    frame_collate([_deferred(a[:100, :100], (24, 32)) for a in arrays])  # small sources: native anywhere
    assert len(calls) == 1


@needs_native_resize
def test_a_frame_the_native_resize_does_not_take_is_resized_by_torch() -> None:
    """A pending frame over a transposed view (pixels not packed in rows): torch's op, same pixels."""
    arr = np.random.default_rng(4).integers(0, 256, (40, 30, 3), dtype=np.uint8).transpose(1, 0, 2)
    with pytest.raises(ValueError):
        _frames_module._native_resize([arr], np.empty((1, 10, 12, 3), np.uint8), 10, 12)
    batch = frame_collate([_deferred(arr, (10, 12))])
    assert np.array_equal(batch[0].permute(1, 2, 0).numpy(), _torch_resize(arr, (10, 12)))
    assert np.array_equal(_deferred(arr, (10, 12)).numpy(), _torch_resize(arr, (10, 12)))
