"""SeedVR2 window-aligned sequence parallelism (backend/parallel/seedvr2_window_shard.py).

Plan: every window exactly once per layout, the LPT greedy bound and the optimum bound on small instances, ties
toward the rank holding the window's rows. Transitions: the all-to-all plans, replayed in one process for 1..5 ranks,
and on 2 and 4 gloo CPU ranks, move rows exactly as the canonical permutations do (bitwise), with ranks that own no
window. Layers: a few random joint window-attention layers through window_attention_rows on 2 and 4 ranks equal the
canonical single-rank window_attention (fp32 <= 1e-5; the text sum's order differs, so not bitwise)."""

import itertools
import math
import os

import pytest
import torch
import torch.multiprocessing as mp

from comfyui_h3.backend.executor.mp_executor import _free_port
from comfyui_h3.backend.models.seedvr2.window_attention import window_attention
from comfyui_h3.backend.models.seedvr2.windows import REGULAR, SHIFTED, layer_window_methods, window_layout
from comfyui_h3.backend.parallel import seedvr2_window_shard as window_shard
from comfyui_h3.backend.parallel.context import SINGLE
from comfyui_h3.backend.parallel.seedvr2_window_shard import (
    ShardedWindowRouting, WindowShardPlan, assign_windows, plan_report, window_cost)

# Several spatial and temporal windows (8 / 8), temporal only with an empty shifted window dropped (4 / 4), one window.
GRIDS = [(2, 21, 23), (10, 6, 8), (1, 4, 6)]
LAYERS = 4  # regular, shifted, regular, shifted: three layout changes
HEADS, HEAD_DIM, WIDTH, TXT = 2, 8, 16, 5


def _tokens(grid, seed=0):
    return torch.randn(math.prod(grid), 3, 5, generator=torch.Generator().manual_seed(seed))


# -- LPT ----------------------------------------------------------------------------------------------------------

def _loads(costs, owners, world):
    loads = [0] * world
    for c, r in zip(costs, owners):
        loads[r] += c
    return loads


def test_lpt_greedy_bound_and_small_optimum():
    gen = torch.Generator().manual_seed(3)
    for world in range(1, 5):
        for k in range(0, 8):
            costs = torch.randint(1, 50, (k,), generator=gen).tolist()
            owners = assign_windows(costs, world)
            assert len(owners) == k and all(0 <= r < world for r in owners)
            loads = _loads(costs, owners, world)
            # Greedy: when a rank got its last (smallest) window it was the least loaded, so it ends at most that
            # window above the final minimum.
            for r in range(world):
                mine = [c for c, o in zip(costs, owners) if o == r]
                if mine:
                    assert loads[r] - min(mine) <= min(loads)
            if k and world <= 3:  # Graham's LPT bound against the brute-force optimum
                best = min(max(_loads(costs, a, world)) for a in itertools.product(range(world), repeat=k))
                assert max(loads) <= (4 / 3 - 1 / (3 * world)) * best + 1e-9


def test_lpt_ties_go_to_the_rank_holding_most_rows_then_the_lowest():
    # Four equal windows on two ranks: window 0 first (stable order), both ranks empty: affinity picks rank 1.
    affinity = torch.tensor([[1, 5], [5, 1], [2, 2], [0, 0]])
    assert assign_windows([7, 7, 7, 7], 2, affinity) == (1, 0, 0, 1)
    assert assign_windows([7, 7, 7, 7], 2) == (0, 1, 0, 1)  # no affinity: lowest rank
    # Descending cost first; the biggest window goes to rank 2 (its rows are there) although rank 0 is lower.
    assert assign_windows([1, 9], 3, torch.tensor([[3, 0, 0], [0, 0, 4]])) == (0, 2)
    # More ranks than windows: some ranks own nothing.
    assert assign_windows([4, 4], 4) == (0, 1)
    assert assign_windows([], 3) == ()
    with pytest.raises(ValueError, match="affinity has shape"):
        assign_windows([1, 2], 2, torch.zeros(3, 2))
    with pytest.raises(ValueError, match="at least one rank"):
        assign_windows([1], 0)


def test_window_cost_counts_attention_over_window_and_text_plus_linear_rows():
    assert window_cost(10, text_len=58, linear_cost=3) == 10 * 68 + 30
    assert window_cost(0) == 0


# -- plan ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("grid", GRIDS + [(3, 31, 17)])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_plan_holds_every_window_once_per_layout(grid, world):
    plan = WindowShardPlan(grid, world)
    n = math.prod(grid)
    for method in (REGULAR, SHIFTED):
        layout = window_layout(method, grid)
        held = sorted(w for r in range(world) for w in plan.rank_windows(method, r))
        assert held == list(range(len(layout.windows)))
        ids = torch.cat([plan.rank_rows(method, r) for r in range(world)])
        assert torch.equal(ids.sort().values, torch.arange(n))
        starts = [0] + list(itertools.accumulate(layout.lengths))
        for r in range(world):
            rows = plan.layer_rows(method, r)
            assert rows.layout is layout and rows.total_windows == len(layout.windows)
            # local order = my windows in layout order, each window's rows in window order
            want = [layout.perm[starts[w]:starts[w + 1]] for w in plan.rank_windows(method, r)]
            assert torch.equal(rows.row_ids, torch.cat(want) if want else torch.empty(0, dtype=torch.int64))
            # groups: every local row exactly once, each group row one whole window of that shape
            pos = torch.cat([idx.reshape(-1) for _, idx in rows.groups]) if rows.groups else torch.empty(0)
            assert torch.equal(pos.sort().values.long(), torch.arange(rows.row_ids.numel()))
            window_rows = {tuple(layout.perm[starts[w]:starts[w + 1]].tolist()) for w in plan.rank_windows(method, r)}
            for shape, idx in rows.groups:
                assert idx.shape[1] == math.prod(shape) and idx.shape[0] >= 1
                for window in idx:
                    assert tuple(rows.row_ids[window].tolist()) in window_rows


def test_second_layout_ties_follow_the_rows_of_the_first():
    grid, world = (3, 31, 17), 4
    plan = WindowShardPlan(grid, world)
    held = [set(plan.rank_rows(REGULAR, r).tolist()) for r in range(world)]
    shifted = window_layout(SHIFTED, grid)
    starts = [0] + list(itertools.accumulate(shifted.lengths))
    affinity = torch.tensor([[len(held[r] & set(shifted.perm[starts[w]:starts[w + 1]].tolist()))
                              for r in range(world)] for w in range(len(shifted.windows))])
    costs = [window_cost(n) for n in shifted.lengths]
    assert plan.owners[SHIFTED] == assign_windows(costs, world, affinity)
    assert plan.owners[REGULAR] == assign_windows([window_cost(n) for n in window_layout(REGULAR, grid).lengths],
                                                  world)
    # the tie-break only chooses among equally loaded ranks: it moves fewer rows than lowest-rank ties, same loads
    blind = assign_windows(costs, world)
    assert sorted(plan.loads(SHIFTED)) == sorted(_loads(costs, blind, world))
    blind_owner = torch.empty(math.prod(grid), dtype=torch.int64)
    for w, r in enumerate(blind):
        blind_owner[shifted.perm[starts[w]:starts[w + 1]]] = r
    regular_owner = torch.empty_like(blind_owner)
    for r in range(world):
        regular_owner[plan.rank_rows(REGULAR, r)] = r
    assert plan.rows_moved(REGULAR, SHIFTED) < int((blind_owner != regular_owner).sum())


def _replay(plan, src, dst, local):
    """What the all-to-all and the permutation do, in one process: {rank: rows in dst}."""
    world = plan.world
    trans = [plan.transition(src, dst, r) for r in range(world)]
    chunks = [list(local[r][t.send_index].split(list(t.send_splits))) for r, t in enumerate(trans)]
    out = {}
    for d, t in enumerate(trans):
        got = [chunks[s][d] for s in range(world)]
        assert [g.shape[0] for g in got] == list(t.recv_splits)
        out[d] = torch.cat(got)[t.recv_perm]
    return out


@pytest.mark.parametrize("grid", GRIDS + [(4, 17, 30)])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_transitions_move_rows_like_the_canonical_permutation(grid, world):
    plan = WindowShardPlan(grid, world)
    tokens = _tokens(grid)
    for src, dst in ((REGULAR, SHIFTED), (SHIFTED, REGULAR)):
        local = {r: tokens[plan.rank_rows(src, r)] for r in range(world)}
        moved = _replay(plan, src, dst, local)
        for r in range(world):
            assert torch.equal(moved[r], tokens[plan.rank_rows(dst, r)])


def test_one_window_grid_rank_0_holds_everything_and_nothing_moves():
    plan = WindowShardPlan((1, 4, 6), 4)
    for method in (REGULAR, SHIFTED):
        assert plan.rank_rows(method, 0).numel() == 24
        assert all(plan.rank_rows(method, r).numel() == 0 and plan.layer_rows(method, r).groups == ()
                   for r in (1, 2, 3))
    assert plan.rows_moved(REGULAR, SHIFTED) == 0
    t = plan.transition(REGULAR, SHIFTED, 2)
    assert t.send_splits == (0, 0, 0, 0) and t.recv_splits == (0, 0, 0, 0) and t.send_index.numel() == 0


def test_plan_report_balance_and_traffic():
    rep = plan_report((3, 31, 17), 4, num_layers=5, row_bytes=64 * 2)
    plan = window_shard.shard_plan((3, 31, 17), 4)
    assert rep["boundaries"] == 4 and rep["tokens"] == 1581
    for method in (REGULAR, SHIFTED):
        loads = plan.loads(method)
        entry = rep["layouts"][method]
        assert entry["cost_per_rank"] == list(loads)
        assert entry["balance"] == pytest.approx(max(loads) / (sum(loads) / 4)) and entry["balance"] >= 1.0
        assert sum(entry["rows_per_rank"]) == 1581 and sum(entry["windows_per_rank"]) == 12
    for key, (src, dst) in (("%s->%s" % (REGULAR, SHIFTED), (REGULAR, SHIFTED)),
                            ("%s->%s" % (SHIFTED, REGULAR), (SHIFTED, REGULAR))):
        owner = {m: torch.empty(1581, dtype=torch.int64) for m in (src, dst)}
        for m in (src, dst):
            for r in range(4):
                owner[m][plan.rank_rows(m, r)] = r
        moved = int((owner[src] != owner[dst]).sum())
        assert rep["transitions"][key]["rows_moved"] == moved > 0
        assert rep["transitions"][key]["bytes_moved"] == moved * 128
        assert 0 < rep["transitions"][key]["max_rows_sent"] <= moved
    one = plan_report((1, 4, 6), 3, num_layers=1)
    assert one["boundaries"] == 0 and one["transitions"] == {} and one["layouts"][REGULAR]["balance"] == 3.0


def test_host_staging_only_where_gloo_serves_a_device(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: "cpu:gloo,cuda:nccl")
    assert not window_shard._host_staged(None, torch.device("cuda", 0))
    assert not window_shard._host_staged(None, torch.device("cpu"))
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: "cpu:gloo,cuda:gloo")
    assert window_shard._host_staged(None, torch.device("cuda", 1))
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: "nccl")
    assert not window_shard._host_staged(None, torch.device("cuda", 0))


# -- routing on one rank (no process group) ----------------------------------------------------------------------

def test_routing_checks_layers_and_rows():
    from comfyui_h3.backend.models.seedvr2.routing import WindowRouting

    routing = ShardedWindowRouting(SINGLE, (2, 21, 23), 2)
    assert isinstance(routing, WindowRouting)
    x = routing.start(_tokens((2, 21, 23)))
    with pytest.raises(ValueError, match="expected \\[966, C\\]"):
        routing.start(torch.zeros(965, 4))
    with pytest.raises(ValueError, match="call finish"):
        routing.advance(routing.advance(x, 0), 1)
    with pytest.raises(ValueError, match="holds 966 rows"):
        routing.advance(x[:-1], 0)
    with pytest.raises(ValueError, match="outside the 2 layers"):
        routing.rows(2)
    with pytest.raises(ValueError, match="at least one layer"):
        ShardedWindowRouting(SINGLE, (2, 21, 23), 0)


def _weights(layers, device="cpu"):
    gen = torch.Generator().manual_seed(11)
    scale = 0.5 / math.sqrt(WIDTH)
    return [[(torch.randn(WIDTH, WIDTH, generator=gen) * scale).to(device) for _ in range(8)] for _ in range(layers)]


def _inputs(grid, device="cpu"):
    gen = torch.Generator().manual_seed(12)
    return (torch.randn(math.prod(grid), WIDTH, generator=gen).to(device),
            torch.randn(TXT, WIDTH, generator=gen).to(device))


def _heads(x):
    return x.reshape(x.shape[0], HEADS, HEAD_DIM)


def _layer(w, x, txt, attend):
    """A joint window-attention layer with random weights: residual video and text updates."""
    qkv = [_heads(x @ w[i]) for i in range(3)] + [_heads(txt @ w[i]) for i in range(3, 6)]
    vid, txt_out = attend(*qkv)
    return x + vid.reshape(x.shape[0], WIDTH) @ w[6], txt + txt_out.reshape(TXT, WIDTH) @ w[7]


def _canonical_layers(grid, layers, device="cpu"):
    x, txt = _inputs(grid, device)
    for w, method in zip(_weights(layers, device), layer_window_methods(layers)):
        layout = window_layout(method, grid)
        x, txt = _layer(w, x, txt, lambda *qkv: window_attention(*qkv, layout))
    return x, txt


def _routed_layers(routing, grid, layers, device="cpu"):
    from comfyui_h3.backend.models.seedvr2.window_attention import window_attention_rows

    x, txt = _inputs(grid, device)
    x = routing.start(x)
    for i, w in enumerate(_weights(layers, device)):
        rows = routing.rows(i)

        def attend(*qkv):
            vid, txt_sum = window_attention_rows(*qkv, rows)
            return vid, (routing.reduce_text(txt_sum) / rows.total_windows).to(txt.dtype)

        x, txt = _layer(w, x, txt, attend)
        if i + 1 < layers:
            x = routing.advance(x, i)
    return routing.finish(x), txt


def test_one_rank_routing_equals_canonical_layers():
    grid = GRIDS[0]
    want_x, want_t = _canonical_layers(grid, 3)
    got_x, got_t = _routed_layers(ShardedWindowRouting(SINGLE, grid, 3), grid, 3)
    assert torch.allclose(got_x, want_x, rtol=0, atol=1e-6) and torch.allclose(got_t, want_t, rtol=0, atol=1e-6)


DIT_GRID = (2, 21, 23)  # token grid; the latent is [2, 42, 46, 33] (patch 1 x 2 x 2)


def _dit(variant, device="cpu"):
    """The tiny DiT with every parameter drawn from a fixed seed (its own init leaves gates and tables at zero):
    matrices ~ N(0, 1/fan_in), vectors near their neutral values (weights ~1, the rest ~0)."""
    from comfyui_h3.backend.models.seedvr2.dit import SeedVR2DiT
    from comfyui_h3.backend.models.seedvr2.dit_config import DiTConfig

    model = SeedVR2DiT(DiTConfig.tiny(variant, txt_dim=16))
    gen = torch.Generator().manual_seed(21)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() >= 2:
                p.copy_(noise / p[0].numel() ** 0.5)
            else:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.05 * noise)
    t, h, w = DIT_GRID
    vid = torch.randn(t, 2 * h, 2 * w, model.config.vid_in_channels, generator=gen)
    txt = torch.randn(TXT, 16, generator=gen)
    return model.eval().to(device), vid.to(device), txt.to(device)


def _dit_local(variant, device="cpu"):
    model, vid, txt = _dit(variant, device)
    with torch.no_grad():
        return model(vid, txt, 1000.0)  # LocalRouting


def _dit_routed(variant, ctx, device="cpu"):
    model, vid, txt = _dit(variant, device)
    routing = ShardedWindowRouting(ctx, DIT_GRID, model.config.layers, model.config.window_counts)
    with torch.no_grad():
        return model(vid, txt, 1000.0, routing=routing)


# -- several ranks: gloo on CPU here; NCCL (and gloo on CUDA tensors) where there are 2 GPUs ------------------------

def _rank(rank, world, port, out_dir, backend="gloo", device_type="cpu"):
    from dist_ranks import join_group, to_cpu

    device, ctx = join_group(rank, world, port, backend, device_type)
    result = {"moves": {}, "layers": {}}
    for grid in GRIDS:
        routing = ShardedWindowRouting(ctx, grid, LAYERS)
        for dtype in (torch.float32, torch.bfloat16):
            tokens = _tokens(grid).to(device=device, dtype=dtype)
            x = routing.start(tokens)
            ok = [torch.equal(x, tokens[routing.rows(0).row_ids])]
            for layer in range(LAYERS - 1):
                x = routing.advance(x, layer)
                ok.append(torch.equal(x, tokens[routing.rows(layer + 1).row_ids]) and x.device == device)
            result["moves"][(grid, str(dtype))] = (ok, x.shape[0], to_cpu(routing.finish(x)))
        if grid != GRIDS[-1]:
            got = _routed_layers(ShardedWindowRouting(ctx, grid, 3), grid, 3, device)
            result["layers"][grid] = tuple(to_cpu(t) for t in got)
    result["dit"] = {variant: to_cpu(_dit_routed(variant, ctx, device)) for variant in ("3b", "7b")}
    result["text"] = to_cpu(routing.reduce_text(torch.full((TXT, HEADS, HEAD_DIM), rank + 1.0, device=device)))
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    from dist_ranks import leave_group

    leave_group()


def _spawn(out, world, backend="gloo", device_type="cpu"):
    mp.spawn(_rank, args=(world, _free_port(), str(out), backend, device_type), nprocs=world)
    return world, [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def ranks(request, tmp_path_factory):
    return _spawn(tmp_path_factory.mktemp(f"window_shard_{request.param}"), request.param)


def _check_moves(world, results):
    for grid in GRIDS:
        for dtype in (torch.float32, torch.bfloat16):
            tokens = _tokens(grid).to(dtype)
            sizes = []
            for rank, res in enumerate(results):
                ok, size, final = res["moves"][(grid, str(dtype))]
                assert all(ok), (grid, rank, ok)
                sizes.append(size)
                if rank == 0:
                    assert torch.equal(final, tokens)  # pure moves: bitwise
                else:
                    assert final is None
            if grid == (1, 4, 6):  # one window: ranks 1.. own nothing and still joined every collective
                assert sizes == [24] + [0] * (world - 1)
    for res in results:
        assert torch.equal(res["text"], torch.full((TXT, HEADS, HEAD_DIM), world * (world + 1) / 2))


def _check_layers(world, results, device="cpu"):
    for grid in GRIDS[:-1]:
        want_x, want_t = (t.cpu() for t in _canonical_layers(grid, 3, device))
        got_x = results[0]["layers"][grid][0]
        assert ((got_x - want_x).norm() / want_x.norm()).item() <= 1e-5
        for rank, res in enumerate(results):
            assert rank == 0 or res["layers"][grid][0] is None
            got_t = res["layers"][grid][1]  # every rank ends with the same text
            assert ((got_t - want_t).norm() / want_t.norm()).item() <= 1e-5


def _check_dit(world, results, device="cpu"):
    for variant in ("3b", "7b"):
        want = _dit_local(variant, device).cpu()
        got = results[0]["dit"][variant]
        assert got.shape == want.shape and ((got - want).norm() / want.norm()).item() <= 1e-5, variant
        assert all(res["dit"][variant] is None for res in results[1:])


@pytest.mark.slow
def test_rows_follow_the_layers_and_text_sums_reduce_on_gloo_ranks(ranks):
    _check_moves(*ranks)


def test_window_layers_on_gloo_ranks_equal_one_rank(ranks):
    _check_layers(*ranks)


def test_tiny_dit_on_gloo_ranks_equals_local_routing(ranks):
    _check_dit(*ranks)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="fewer than 2 CUDA devices on this machine (the gloo CPU "
                    "tests above run the same plan and collectives)")
@pytest.mark.parametrize("backend", ["cpu:gloo,cuda:nccl", "gloo"])
def test_cuda_ranks_equal_one_gpu(tmp_path, backend):
    # The engine's group (NCCL for CUDA tensors) and a gloo-only group, whose collectives run on host copies.
    world, results = _spawn(tmp_path, 2, backend, "cuda")
    _check_moves(world, results)
    _check_layers(world, results, "cuda:0")
    _check_dit(world, results, "cuda:0")
