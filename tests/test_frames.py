"""Frame and frame_collate: shapes, values and structure match PILToTensor + default_collate."""

from __future__ import annotations

import collections
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from threadloader import Frame, frame_collate
from threadloader._context import set_collating

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
