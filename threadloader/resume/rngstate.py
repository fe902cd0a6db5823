"""Generator states as plain values: the base64 of a CPU generator state's bytes, for JSON."""

from __future__ import annotations

import base64
import binascii

import torch

__all__ = ["decode_rng_state", "encode_rng_state"]

_RNG_STATE_BYTES = torch.get_rng_state().numel()


def encode_rng_state(state: torch.Tensor) -> str:
    """A CPU generator state (a uint8 tensor) as a base64 string, for a JSON-serialisable state dict."""
    return base64.b64encode(state.contiguous().numpy().tobytes()).decode("ascii")


def decode_rng_state(text: str) -> torch.Tensor:
    """The CPU generator state :func:`encode_rng_state` wrote.

    Raises:
        ValueError: ``text`` is not the base64 of a CPU generator state.
    """
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, AttributeError) as e:
        raise ValueError(f"not a base64 generator state: {e}") from None
    if len(raw) != _RNG_STATE_BYTES:
        raise ValueError(f"a generator state has {_RNG_STATE_BYTES} bytes, not {len(raw)}")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)
