"""What every denoise loop (pipeline.denoise, editing_loop) builds around its DiT calls, in one place: the rotary
tables (once per request, from the layout), the AdaLN row segments of a step (on the host, from host tensors, so the
forward never syncs with the device), and the Stop check at a step boundary (agreed by all ranks)."""

from __future__ import annotations

from typing import Callable

import torch

from ...models.h3_ops import RowSegments, rope_tables
from ...models.h3_transformer import MODALITY_COUNT


from ...errors import Cancelled  # noqa: F401 - raised here at a step boundary


def _local(shard):
    return (lambda t: t) if shard is None else shard.local


def request_rope(dit, position_ids: torch.Tensor, shard=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of the rows this rank owns; `position_ids` [S, 3] on the DiT's device. Layout-only: once a request."""
    local = _local(shard)
    cos, sin = rope_tables(position_ids, dit.rope_inv_freq)
    return local(cos), local(sin)


def step_segments(token_tags: torch.Tensor, row_index: torch.Tensor, shard=None) -> tuple[RowSegments, RowSegments]:
    """(AdaLN segments, norm-out segments) of this rank's rows, from HOST tensors: token_tags [S], row_index [S]."""
    local = _local(shard)
    adaln_rows = row_index * MODALITY_COUNT + token_tags
    return RowSegments.from_rows(local(adaln_rows)), RowSegments.from_rows(local(row_index))


def stop_at_boundary(should_stop: Callable[[], bool] | None, shard, step: int, total: int) -> None:
    """Raise Cancelled before `step` when asked to stop; with several ranks all of them stop here, or none does."""
    stop = should_stop is not None and should_stop()
    if shard is not None:
        stop = shard.any(stop)
    if stop:
        raise Cancelled(f"Stopped before step {step + 1}/{total}.")
