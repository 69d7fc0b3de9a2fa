"""SeedVR2 long-video batches: the plan, the cross-fade weights and the streaming blender (CPU, no model)."""

import pytest
import torch

from comfyui_h3.backend.errors import RequestError
from comfyui_h3.backend.pipelines.seedvr2 import batches as B


def _coverage(plan):
    cov = torch.zeros(plan.frames, dtype=torch.int64)
    for s, e in plan.spans:
        cov[s:e] += 1
    return cov


@pytest.mark.parametrize("frames,batch,overlap,spans", [
    (1, 17, 8, [(0, 1)]),                                 # one frame: one batch of its own length
    (10, 17, 8, [(0, 10)]),                               # shorter than a batch
    (17, 17, 8, [(0, 17)]),                               # exactly one batch
    (35, 17, 8, [(0, 17), (9, 26), (18, 35)]),            # exact fit: no slide
    (33, 17, 8, [(0, 17), (9, 26), (16, 33)]),            # last batch slid back to end at the last frame
    (18, 17, 8, [(0, 17), (1, 18)]),                      # one frame too many: the slid batch shares 16
    (34, 17, 0, [(0, 17), (17, 34)]),                     # no overlap, exact
    (40, 17, 0, [(0, 17), (17, 34), (23, 40)]),           # no overlap asked; the slide makes one
    (28, 17, 12, [(0, 17), (5, 22), (10, 27), (11, 28)]),  # overlap > B/2: three batches share frames
    (12, 5, 4, [(0, 5), (1, 6), (2, 7), (3, 8), (4, 9), (5, 10), (6, 11), (7, 12)]),
])
def test_plan_spans(frames, batch, overlap, spans):
    plan = B.plan_batches(frames, batch, overlap)
    assert list(plan.spans) == spans
    assert plan.count == len(spans)
    assert (_coverage(plan) >= 1).all()


@pytest.mark.parametrize("frames", [18, 33, 50, 97, 240, 241])
@pytest.mark.parametrize("batch,overlap", [(17, 8), (17, 0), (21, 4), (5, 1), (33, 16), (9, 8)])
def test_plan_invariants(frames, batch, overlap):
    plan = B.plan_batches(frames, batch, overlap)
    if frames <= batch:
        assert plan.spans == ((0, frames),)
        return
    starts = [s for s, _ in plan.spans]
    assert all(e - s == batch for s, e in plan.spans)  # every batch full size when the video is longer
    assert starts[0] == 0 and plan.spans[-1][1] == frames
    assert all(b > a for a, b in zip(starts, starts[1:]))
    stride = batch - overlap
    assert starts[:-1] == [k * stride for k in range(len(starts) - 1)]
    assert plan.spans[-1][0] <= (len(starts) - 1) * stride  # the last one slid back (or exactly on the grid)
    assert (_coverage(plan) >= 1).all()


@pytest.mark.parametrize("batch", [0, 1, 3, 4, 6, 16, 18, -3])
def test_bad_batch_is_a_request_error(batch):
    with pytest.raises(RequestError, match="4n\\+1") as err:
        B.plan_batches(100, batch, 0)
    assert "\n" not in str(err.value)


def test_a_single_frame_is_one_batch_of_one():
    assert B.plan_batches(1, 1, 0).spans == ((0, 1),)
    with pytest.raises(RequestError, match="4n\\+1"):
        B.plan_batches(2, 1, 0)
    with pytest.raises(RequestError, match="4n\\+1"):
        B.plan_batches(3, 4, 0)


@pytest.mark.parametrize("overlap", [-1, 17, 30])
def test_bad_overlap_is_a_request_error(overlap):
    with pytest.raises(RequestError, match="overlap") as err:
        B.plan_batches(100, 17, overlap)
    assert "\n" not in str(err.value)


def test_short_batches_are_flagged_only_when_they_cut_the_video():
    assert not B.keeps_temporal_attention(13) and B.keeps_temporal_attention(17)
    assert B.plan_batches(100, 13, 4).warning and "temporal" in B.plan_batches(100, 13, 4).warning
    assert B.plan_batches(100, 17, 4).warning is None
    assert B.plan_batches(9, 13, 4).warning is None  # the whole video is one batch: nothing lost to batching


@pytest.mark.parametrize("frames,batch,overlap", [
    (18, 17, 8), (33, 17, 8), (35, 17, 8), (28, 17, 12), (40, 17, 0), (100, 21, 4), (60, 9, 8), (10, 17, 8),
    (241, 33, 16)])
def test_weights_sum_to_one_and_ramp_in_from_low(frames, batch, overlap):
    plan = B.plan_batches(frames, batch, overlap)
    weights = B.blend_weights(plan)
    total = torch.zeros(frames, dtype=torch.float64)
    for (s, e), w in zip(plan.spans, weights):
        assert w.dtype == torch.float64 and w.shape == (e - s,)
        assert (w > 0).all() and (w <= 1).all()
        total[s:e] += w
    assert torch.allclose(total, torch.ones(frames, dtype=torch.float64), rtol=0, atol=1e-12)
    cov = _coverage(plan)
    for (s, e), w in zip(plan.spans, weights):
        assert (w[cov[s:e] == 1] == 1.0).all()  # a frame only one batch covers is that batch's, exactly
    for b in range(1, plan.count):
        (ps, pe), (s, _) = plan.spans[b - 1], plan.spans[b]
        incoming, outgoing = weights[b][:pe - s], weights[b - 1][s - ps:]
        if pe == s:  # no overlap: a plain cut between whole batches
            continue
        if cov[s:pe].max() == 2:  # a plain two-batch cross-fade: rising, complementary, incoming starts lowest
            assert (incoming[1:] > incoming[:-1]).all()
            assert torch.allclose(incoming + outgoing, torch.ones_like(incoming), rtol=0, atol=1e-15)
        assert incoming[0] < outgoing[0] and incoming[0] == incoming.min()


def _video(frames, h=6, w=7, seed=0):
    return torch.randint(0, 256, (frames, h, w, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


@pytest.mark.parametrize("frames,batch,overlap", [(33, 17, 8), (28, 17, 12), (40, 17, 0), (10, 17, 8), (60, 9, 4)])
def test_blending_identical_batches_gives_the_video_back(frames, batch, overlap):
    video = _video(frames)
    plan = B.plan_batches(frames, batch, overlap)
    assert torch.equal(B.blend_batches(plan, [video[s:e] for s, e in plan.spans]), video)
    as_float = [video[s:e].double() / 255 for s, e in plan.spans]
    assert torch.equal(B.blend_batches(plan, as_float), video)


@pytest.mark.parametrize("frames,batch,overlap", [(33, 17, 8), (28, 17, 12), (40, 17, 0), (61, 17, 8)])
def test_stream_blender_equals_dense_blend_and_holds_only_the_overlap(frames, batch, overlap):
    plan = B.plan_batches(frames, batch, overlap)
    gen = torch.Generator().manual_seed(3)
    outs = [torch.rand((e - s, 5, 4, 3), generator=gen) for s, e in plan.spans]
    dense = torch.zeros((frames, 5, 4, 3), dtype=torch.float64)
    for (s, e), w, o in zip(plan.spans, B.blend_weights(plan), outs):
        dense[s:e] += w.view(-1, 1, 1, 1) * o.double()
    expected = (dense * 255).round()
    blender = B.StreamBlender(plan)
    got = []
    for b, out in enumerate(outs):
        before = out.clone()
        chunks = blender.push(out)
        assert torch.equal(out, before)  # the caller's frames are never modified
        got += chunks
        assert blender.emitted == plan.final_before(b) == sum(c.shape[0] for c in got)
        assert blender.held <= plan.max_overlap
        assert all(c.dtype == torch.uint8 for c in chunks)
    assert blender.done and blender.held == 0
    diff = (torch.cat(got).double() - expected).abs()
    assert diff.max() <= 1  # float32 blend vs float64: at most one level, only at rounding ties
    assert (diff > 0).float().mean() < 0.01
    with pytest.raises(ValueError, match="already pushed"):
        blender.push(outs[0])


def test_stream_blender_rejects_a_batch_of_the_wrong_length_or_size():
    plan = B.plan_batches(33, 17, 8)
    blender = B.StreamBlender(plan)
    with pytest.raises(ValueError, match="batch 0"):
        blender.push(_video(16))
    blender.push(_video(17))
    with pytest.raises(ValueError, match="earlier ones"):
        blender.push(_video(17, h=8))


def test_batch_borders_are_cross_faded_not_cut():
    """A smooth video (a slowly moving gradient) restored per batch by a deterministic distortion that differs
    between batches, as independent batches do: a colour offset of +-6 levels alternating per batch and grain of its
    own (seeded by the batch index). Blended, the frame-to-frame change across every border is no larger than the
    largest inside one batch's own output; cut at the next batch's start, it is about twice as large."""
    frames, batch, overlap, h, w = 61, 17, 8, 48, 48
    plan = B.plan_batches(frames, batch, overlap)
    x = torch.arange(w, dtype=torch.float64)
    t = torch.arange(frames, dtype=torch.float64)
    smooth = (60 + 2 * x[None, :] + t[:, None])[:, None, :, None].expand(frames, h, w, 3)  # 1 level per frame
    outs = []
    for b, (s, e) in enumerate(plan.spans):
        grain = torch.randn((e - s, h, w, 3), generator=torch.Generator().manual_seed(100 + b), dtype=torch.float64)
        outs.append((smooth[s:e] + (6.0 if b % 2 else -6.0) + 6.0 * grain).round().clamp(0, 255).to(torch.uint8))

    def change(v):  # mean absolute change from each frame to the next
        return (v[1:].double() - v[:-1].double()).abs().mean(dim=(1, 2, 3))

    inside = max(change(o).max().item() for o in outs)
    cov = _coverage(plan)
    starts = {s for s, _ in plan.spans}
    border = [f for f in range(frames - 1) if cov[f] > 1 or cov[f + 1] > 1 or f + 1 in starts]
    blended = B.blend_batches(plan, outs)
    cut = torch.cat([o[:plan.final_before(i) - plan.spans[i][0]] for i, o in enumerate(outs)])
    assert change(blended)[border].max().item() <= inside
    assert change(cut)[border].max().item() > 1.5 * inside  # the same check fails without the cross-fade

    for b in range(1, plan.count):
        s, pe = plan.spans[b][0], plan.spans[b - 1][1]
        mine, prev = outs[b][:pe - s], outs[b - 1][s - plan.spans[b - 1][0]:]
        region = blended[s:pe]
        differs = lambda a, ref: (a != ref).flatten(1).any(dim=1)  # noqa: E731
        assert differs(region, mine).all() and differs(region, prev).all()
