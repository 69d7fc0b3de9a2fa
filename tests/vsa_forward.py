"""Shared by the VSA and FastH3 tests: an eager and a compiled H3 DiT given the same forward on rows in VSA tile
order must agree, on a sparse and on a dense step of the plan."""

import torch

from comfyui_h3.backend.pipelines.h3.schedule import row_timestep_plan


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def assert_compiled_equals_eager(eager, compiled, layout, plan, tol=1e-5):
    tiled = plan.permute_layout(layout)
    ts, idx = row_timestep_plan(layout, 0.2, 0.7)
    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(1, layout.video_indices.numel(), 96, generator=gen),
            torch.randn(1, layout.audio_indices.numel(), 32, generator=gen),
            torch.randn(1, 4, eager.config.text_dim, generator=gen), ts, idx[plan.order], tiled.token_tags,
            tiled.position_ids, tiled.video_indices, tiled.audio_indices, tiled.text_indices)
    with torch.no_grad():
        for step_plan in (plan, plan.dense()):
            want = eager(*args, attention_plan=step_plan)
            got = compiled(*args, attention_plan=step_plan)
            assert rel_err(got[0], want[0]) <= tol and rel_err(got[1], want[1]) <= tol


def flat_plan(num_prefix, grid, topk):
    """A VSA plan over rows already in tile order (the kernels' input) -> (plan, rows)."""
    from comfyui_h3.backend.attention.vsa_plan import VSAPlan, VSASettings, tile_order

    _, sizes = tile_order(grid)
    s = num_prefix + int(sizes.sum())
    return VSAPlan(torch.arange(s), torch.arange(s), num_prefix, sizes, grid, VSASettings(topk=topk)), s
