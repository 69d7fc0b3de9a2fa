"""SeedVR2 video VAE vs the official video_vae_v3 (fixtures made by tools/make_seedvr2_vae_goldens.py): released
key list and parameter count, tiny-model encode/decode goldens (fp32 rel <= 1e-5), causal time slicing equal to the
whole pass, the memory pieces (row bands, group chunks, query chunks, depth-to-space bands) equal to whole ops, and
a channels_last_3d pass equal to the goldens."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from repo_paths import FIXTURES
from comfyui_h3.backend.models.seedvr2 import vae_layout, vae_ops
from comfyui_h3.backend.models.seedvr2.vae import (
    in_pieces,
    LATENT_SCALE,
    LATENT_SHIFT,
    SeedVR2VAE,
    VAEConfig,
    rename_legacy_keys,
)

with safe_open(str(FIXTURES / "seedvr2_vae.safetensors"), framework="pt") as _f:
    META = _f.metadata()
    T = {k: _f.get_tensor(k) for k in _f.keys()}
KEYS = json.loads((FIXTURES / "seedvr2_vae_keys.json").read_text())
ENCODE = json.loads(META["encode"])
DECODE = json.loads(META["decode"])
TOL = 1e-5


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(scope="module")
def vae():
    model = SeedVR2VAE(VAEConfig.tiny()).eval()
    model.load_state_dict({k[2:]: v.float() for k, v in T.items() if k.startswith("w.")}, strict=True)
    return model


def test_fixtures_record_official_commit():
    for meta in (META, KEYS):
        assert meta["source"] == "github.com/ByteDance-Seed/SeedVR" and len(meta["commit"]) == 40
    assert KEYS["commit"] == META["commit"] and KEYS["tensors"] == len(KEYS["keys"]) == 250
    assert json.loads(META["tiny"]) == {"block_out_channels": list(VAEConfig.tiny().block_channels),
                                        "norm_num_groups": VAEConfig.tiny().norm_groups}


def test_released_keys_shapes_and_parameter_count_are_the_official_ones():
    with torch.device("meta"):
        model = SeedVR2VAE(VAEConfig.released())
    ours = [(k, list(v.shape)) for k, v in model.state_dict().items()]
    assert ours == list(KEYS["keys"].items())  # same keys, shapes and module order
    params = sum(p.numel() for p in model.parameters())
    assert params == KEYS["params"] == 250_648_227
    assert not list(model.buffers())


def test_tiny_has_the_released_structure():
    with torch.device("meta"):
        tiny = SeedVR2VAE(VAEConfig.tiny())
    assert list(tiny.state_dict()) == list(KEYS["keys"])
    assert sorted(k[2:] for k in T if k.startswith("w.")) == sorted(KEYS["keys"])


def _shortcuts_where_widths_change(shapes):
    """(resnets with a conv_shortcut, resnets whose in and out channels differ) of a key -> shape map."""
    with_shortcut, changing = set(), set()
    for key, shape in shapes.items():
        if key.endswith(".conv1.weight"):
            base = key[: -len("conv1.weight")]
            if base + "conv_shortcut.weight" in shapes:
                with_shortcut.add(base)
            if shape[1] != shapes[base + "conv2.weight"][0]:
                changing.add(base)
    return with_shortcut, changing


def test_tiny_is_the_released_structure_at_small_widths():
    # The released key list (official code) is the oracle: same tensors in the same order, the same ranks, kernel
    # sizes and fixed channels (RGB, latent), and conv shortcuts exactly in the resnets whose widths change.
    released = {k: list(v) for k, v in KEYS["keys"].items()}
    with torch.device("meta"):
        tiny = {k: list(v.shape) for k, v in SeedVR2VAE(VAEConfig.tiny()).state_dict().items()}
    assert list(tiny) == list(released)
    for key, want in released.items():
        got = tiny[key]
        assert len(got) == len(want), key
        assert got[2:] == want[2:], key  # kernel sizes
        for g, w in zip(got[:2], want[:2]):
            assert g == w if w < 64 else g < w, key  # io channels kept, widths smaller
    with_shortcut, changing = _shortcuts_where_widths_change(released)
    assert with_shortcut == changing and len(changing) == 4
    assert _shortcuts_where_widths_change(tiny) == (with_shortcut, changing)


def test_latent_scaling_constants():
    assert LATENT_SCALE == 0.9152 and LATENT_SHIFT == 0.0


@pytest.mark.parametrize("i", range(len(ENCODE)), ids=["x".join(map(str, c)) for c in ENCODE])
def test_encode_equals_official(vae, i):
    x = T[f"enc.{i}.x"].float()
    mean, logvar = vae.encode(x, slice_frames=None)
    f, h, w = ENCODE[i]
    assert mean.shape == logvar.shape == (1, 16, (f - 1) // 4 + 1, h // 8, w // 8)
    assert rel(mean, T[f"enc.{i}.mean"]) <= TOL
    assert rel(logvar, T[f"enc.{i}.logvar"]) <= TOL
    # the fixture pushes two logvar channels past the range: the official clamp is exercised
    assert torch.all(logvar[:, 0] == 20.0) and torch.all(logvar[:, 1] == -30.0)
    if f"enc.{i}.sliced.mean" in T:  # default slicing (1 + 4, then 4 frames) vs the official's split_size 4
        mean_s, logvar_s = vae.encode(x)
        assert rel(mean_s, T[f"enc.{i}.sliced.mean"]) <= TOL
        assert rel(logvar_s, T[f"enc.{i}.sliced.logvar"]) <= TOL


@pytest.mark.parametrize("i", range(len(DECODE)), ids=["x".join(map(str, c)) for c in DECODE])
def test_decode_equals_official(vae, i):
    z = T[f"dec.{i}.z"].float()
    out = vae.decode(z, slice_latents=None)
    t, h, w = DECODE[i]
    assert out.shape == (1, 3, 4 * t - 3, 8 * h, 8 * w)
    assert rel(out, T[f"dec.{i}.out"]) <= TOL
    if f"dec.{i}.sliced.out" in T:  # default slicing (latents 0-1, then 1) vs the official's
        assert rel(vae.decode(z), T[f"dec.{i}.sliced.out"]) <= TOL


def _longest(cases):
    return max(range(len(cases)), key=lambda i: cases[i][0])


@pytest.mark.parametrize("slice_frames", [4, 8, 12])
def test_sliced_encode_equals_whole(vae, slice_frames):
    x = T[f"enc.{_longest(ENCODE)}.x"].float()
    assert x.shape[2] == 17
    whole = vae.encode(x, slice_frames=None)
    sliced = vae.encode(x, slice_frames=slice_frames)
    for a, b in zip(sliced, whole):
        assert a.shape == b.shape and rel(a, b) <= TOL


@pytest.mark.parametrize("slice_latents", [1, 2, 3])
def test_sliced_decode_equals_whole(vae, slice_latents):
    z = T[f"dec.{_longest(DECODE)}.z"].float()
    assert z.shape[2] == 5
    whole = vae.decode(z, slice_latents=None)
    sliced = vae.decode(z, slice_latents=slice_latents)
    assert sliced.shape == whole.shape and rel(sliced, whole) <= TOL


def _frames_seen(module, seen):
    return module.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[2]))


@pytest.mark.parametrize("piece_frames", [1, 2, 3])
def test_full_rate_layers_in_pieces_equal_the_goldens_and_see_at_most_a_piece(vae, piece_frames):
    """The layers that keep the frame rate (encoder: conv_in and block 0; decoder: the blocks after the temporal
    upsamplers and conv_out) run each time slice in pieces: the same result (the official goldens, fp32 1e-5), and
    those layers never see more than a piece of frames (what bounds their activations)."""
    i = _longest(ENCODE)
    x = T[f"enc.{i}.x"].float()
    seen = []
    hooks = [_frames_seen(vae.encoder.conv_in, seen), _frames_seen(vae.encoder.down_blocks[1], [])]
    try:
        mean, logvar = vae.encode(x, piece_frames=piece_frames)
    finally:
        for h in hooks:
            h.remove()
    assert rel(mean, T[f"enc.{i}.sliced.mean"]) <= TOL and rel(logvar, T[f"enc.{i}.sliced.logvar"]) <= TOL
    assert max(seen) <= piece_frames and sum(seen) == x.shape[2]
    i = _longest(DECODE)
    z = T[f"dec.{i}.z"].float()
    seen, upper = [], []
    hooks = [_frames_seen(vae.decoder.conv_out, seen), _frames_seen(vae.decoder.up_blocks[1], upper)]
    try:
        out = vae.decode(z, piece_frames=piece_frames)
    finally:
        for h in hooks:
            h.remove()
    assert rel(out, T[f"dec.{i}.sliced.out"]) <= TOL
    assert max(seen) <= piece_frames and sum(seen) == out.shape[2]
    assert len(upper) == z.shape[2] - 1  # the temporal layers still see whole slices (latents 0-1, then 1 each)
    whole = vae.decode(z, slice_latents=None, piece_frames=piece_frames)  # one slice, in pieces
    assert rel(whole, T[f"dec.{i}.out"]) <= TOL


def test_pieces_only_on_the_plain_stream_and_bad_piece_sizes_are_refused(vae):
    class RankStream(vae_ops.CausalStream):  # as a stream over ranks: carried frames exchanged once per slice
        pass

    calls = []
    x = torch.zeros(1, 2, 5, 4, 4)
    for stream, want in ((vae_ops.CausalStream(), [1] * 5), (RankStream(), [5])):
        calls.clear()
        stream.piece_frames = 1
        in_pieces(lambda piece, _s: calls.append(piece.shape[2]) or piece, x, stream)
        assert calls == want and stream.first and not stream.keep  # the slice's flags are restored
    z = T[f"dec.{_longest(DECODE)}.z"].float()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="piece_frames"):
            vae.decode(z, piece_frames=bad)


def test_causal_prefixes(vae):
    """Causality: a clip's first latents / frames do not depend on what follows them."""
    x = T[f"enc.{_longest(ENCODE)}.x"].float()
    assert rel(vae.encode(x[:, :, :5])[0], vae.encode(x)[0][:, :, :2]) <= TOL
    z = T[f"dec.{_longest(DECODE)}.z"].float()
    assert rel(vae.decode(z[:, :, :2]), vae.decode(z)[:, :, :5]) <= TOL


def test_small_chunks_equal_whole_ops_and_bound_every_conv_input(vae, monkeypatch):
    """A chunk budget far below the frame sizes forces row bands (with halos), per-frame and per-group GroupNorm,
    chunked attention queries and banded depth-to-space; results equal the unchunked pass and no conv reads a
    padded input larger than the budget."""
    budget = 80 * 1024  # >= the largest 3-row band (16 channels x 7 frames x 3 x 50 x 4 bytes)
    x = T[f"enc.{_longest(ENCODE)}.x"].float()
    z = T["dec.1.z"].float()  # 2 latents of 4 x 6 -> 5 frames of 32 x 48
    whole_enc = vae.encode(x, slice_frames=None)
    whole_dec = vae.decode(z, slice_latents=None)
    seen = []
    real_conv3d = F.conv3d

    def conv3d(inp, *a, **k):
        seen.append(inp.numel() * inp.element_size())
        return real_conv3d(inp, *a, **k)

    monkeypatch.setattr(vae_ops.F, "conv3d", conv3d)
    enc = vae.encode(x, slice_frames=4, chunk_bytes=budget)
    dec = vae.decode(z, slice_latents=1, chunk_bytes=budget)
    monkeypatch.undo()
    for a, b in zip(enc, whole_enc):
        assert rel(a, b) <= TOL
    assert rel(dec, whole_dec) <= TOL
    assert max(seen) <= budget and len(seen) > 3 * 80  # many more calls than convs: banded


def test_conv_outputs_are_banded_below_the_element_limit(vae, monkeypatch):
    """A conv whose input fits the budget but whose output would pass cuDNN's 32-bit element count (the 3 -> C
    input conv at full size) runs in row bands too; the result is unchanged."""
    x = T[f"enc.{_longest(ENCODE)}.x"].float()
    outs = []
    real_conv3d = F.conv3d

    def conv3d(inp, *a, **k):
        y = real_conv3d(inp, *a, **k)
        outs.append(y.numel())
        return y

    monkeypatch.setattr(vae_ops.F, "conv3d", conv3d)
    whole = vae.encode(x)
    calls, biggest = len(outs), max(outs)
    limit = biggest * 2 // 3  # below the input conv's whole-slice output (8 channels x 5 frames x 16 x 24)
    outs.clear()
    monkeypatch.setattr(vae_ops, "MAX_CONV_ELEMENTS", limit)
    banded = vae.encode(x)
    monkeypatch.undo()
    assert max(outs) <= limit and len(outs) > calls
    for a, b in zip(banded, whole):
        assert rel(a, b) <= TOL


def test_group_norm_chunks_equal_torch_group_norm():
    gen = torch.Generator().manual_seed(3)
    norm = torch.nn.GroupNorm(8, 32, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(32, generator=gen))
        norm.bias.copy_(0.3 * torch.randn(32, generator=gen))
    x = torch.randn(2, 32, 3, 5, 7, generator=gen) * 3 + 1
    ref = norm(x.transpose(1, 2).reshape(6, 32, 5, 7)).reshape(2, 3, 32, 5, 7).transpose(1, 2)
    frame = 2 * 32 * 5 * 7 * 4
    for budget in (10**9, frame, frame // 4, 1):  # whole, per frame, 2 groups at a time, one group at a time
        out = vae_ops.group_norm(norm, x, budget)
        assert rel(out, ref) <= 1e-6
        assert rel(vae_ops.group_norm(norm, x, budget, silu=True), F.silu(ref)) <= 1e-6


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "math-query-chunks"])
def test_frame_attention_equals_one_softmax(fused, monkeypatch):
    if not fused:  # as where no fused SDPA kernel applies
        monkeypatch.setattr(vae_ops, "_sdpa_fused", lambda q, k, v: None)
    gen = torch.Generator().manual_seed(5)
    attn = vae_ops.FrameAttention(16, 4, 1e-6)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    x = torch.randn(2, 16, 2, 6, 5, generator=gen)
    # reference: explicit softmax per frame over its 30 tokens, float64
    ref = torch.empty_like(x, dtype=torch.float64)
    a64 = {k: v.double() for k, v in attn.state_dict().items()}
    for b in range(2):
        for t in range(2):
            f = x[b, :, t].double()
            g = F.group_norm(f[None], 4, a64["group_norm.weight"], a64["group_norm.bias"], 1e-6)[0]
            g = g.reshape(16, 30).t()
            q, k, v = (F.linear(g, a64[f"to_{n}.weight"], a64[f"to_{n}.bias"]) for n in "qkv")
            o = torch.softmax(q @ k.t() / 16**0.5, -1) @ v
            ref[b, :, t] = F.linear(o, a64["to_out.0.weight"], a64["to_out.0.bias"]).t().reshape(16, 6, 5) + f
    for budget in (10**9, 2 * 4 * 30 * 7, 1):  # one block, 7-row query chunks, one query at a time
        assert rel(attn(x, budget), ref) <= 1e-6


@pytest.mark.parametrize("r,drop", [(1, False), (2, False), (2, True)])
@pytest.mark.parametrize("budget", [10**9, 1])
@pytest.mark.parametrize("layout", ["ncdhw", "channels_last"])
def test_depth_to_space_channel_order(r, drop, budget, layout):
    """out[c, f*r + z, h*2 + x, w*2 + y] = conv(in)[((x*2 + y)*r + z)*C + c, f, h, w], frame 1 dropped if asked."""
    gen = torch.Generator().manual_seed(r)
    c, t, h, w = 3, 2, 3, 4
    conv = torch.nn.Conv3d(c, c * 4 * r, 1)
    x = torch.randn(1, c, t, h, w, generator=gen)
    u = conv(x)[0]
    want = torch.empty(c, t * r, 2 * h, 2 * w)
    for xi in range(2):
        for yi in range(2):
            for zi in range(r):
                for ci in range(c):
                    want[ci, zi::r, xi::2, yi::2] = u[((xi * 2 + yi) * r + zi) * c + ci]
    if drop:
        want = torch.cat([want[:, :1], want[:, 2:]], 1)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        got = vae_ops.depth_to_space(conv, x, 2, r, drop, budget)
    assert vae_layout.is_channels_last(got) == (layout == "channels_last")  # written in the layout it read
    torch.testing.assert_close(got[0], want, rtol=1e-6, atol=1e-6)


def test_a_channels_last_pass_stays_channels_last_and_equals_the_goldens(vae, monkeypatch):
    """On CUDA a pass runs in channels_last_3d end to end. The CPU's conv returns NCDHW for a channels-last input,
    so here the conv is made to answer as cuDNN does (channels-last in, channels-last out); every conv of the pass
    must then see a channels-last input (the 3-channel video and 16-channel latents are entered so) and the
    results equal the official goldens, in time slices and row bands."""
    seen = []
    conv3d = F.conv3d

    def cudnn_like(x, weight, *args, **kwargs):
        seen.append(vae_layout.is_channels_last(x))
        y = conv3d(x, weight, *args, **kwargs)
        return y.contiguous(memory_format=torch.channels_last_3d) if seen[-1] else y

    monkeypatch.setattr(vae_layout, "CHANNELS_LAST", True)
    monkeypatch.setattr(vae_ops.F, "conv3d", cudnn_like)
    try:
        mean, logvar = vae.encode(T["enc.2.x"].float(), chunk_bytes=1 << 16)
        assert rel(mean, T["enc.2.sliced.mean"]) <= TOL and rel(logvar, T["enc.2.sliced.logvar"]) <= TOL
        assert mean.is_contiguous() and logvar.is_contiguous()  # the latents leave in the callers' layout
        assert vae.encoder.conv_in.weight.is_contiguous(memory_format=torch.channels_last_3d)
        out = vae.decode(T["dec.3.z"].float(), chunk_bytes=1 << 16)
        assert rel(out, T["dec.3.sliced.out"]) <= TOL and out.is_contiguous()
        # the full-rate layers in pieces: the pieces and their concatenation stay channels-last too
        mean, _ = vae.encode(T["enc.2.x"].float(), chunk_bytes=1 << 16, piece_frames=2)
        assert rel(mean, T["enc.2.sliced.mean"]) <= TOL
        out = vae.decode(T["dec.3.z"].float(), chunk_bytes=1 << 16, piece_frames=1)
        assert rel(out, T["dec.3.sliced.out"]) <= TOL and out.is_contiguous()
        assert seen and all(seen), f"{seen.count(False)} of {len(seen)} convs read NCDHW"
    finally:
        monkeypatch.undo()
        vae.decode(T["dec.0.z"].float())  # back to NCDHW weights for the module's other tests
    assert vae.encoder.conv_in.weight.is_contiguous()


def test_banded_convs_write_their_frames_in_place_and_equal_the_goldens(vae, monkeypatch):
    """The CUDA form of a banded channels-last conv writes each output frame's rows straight into the output
    (conv_into, cuDNN's out= call). Run here with the CPU's conv behind conv_into: every call gets a contiguous
    channels-last window of the padded band and a contiguous channels-last view into the one output, and the pass
    (time slices, row bands, strided convs, biases added once) still equals the official goldens."""
    calls = []
    real = vae_ops.conv_into

    def recording(x, weight, stride, out):
        fmt = torch.channels_last_3d
        calls.append((x.is_contiguous(memory_format=fmt), out.is_contiguous(memory_format=fmt),
                      out._base is not None, out.shape[2]))
        real(x, weight, stride, out)

    monkeypatch.setattr(vae_layout, "CHANNELS_LAST", True)
    monkeypatch.setattr(vae_ops, "DIRECT_BAND_WRITES", "everywhere")
    monkeypatch.setattr(vae_ops, "conv_into", recording)
    conv3d = F.conv3d
    monkeypatch.setattr(vae_ops.F, "conv3d", lambda x, w, *a, **k: (
        conv3d(x, w, *a, **k).contiguous(memory_format=torch.channels_last_3d)
        if vae_layout.is_channels_last(x) else conv3d(x, w, *a, **k)))  # cuDNN's layout (see the test above)
    try:
        mean, logvar = vae.encode(T["enc.2.x"].float(), chunk_bytes=1 << 16)
        assert rel(mean, T["enc.2.sliced.mean"]) <= TOL and rel(logvar, T["enc.2.sliced.logvar"]) <= TOL
        out = vae.decode(T["dec.3.z"].float(), chunk_bytes=1 << 16)
        assert rel(out, T["dec.3.sliced.out"]) <= TOL
    finally:
        monkeypatch.undo()
        vae.decode(T["dec.0.z"].float())  # back to NCDHW weights for the module's other tests
    assert len(calls) > 100, "the budget should band many convs"
    assert all(c[0] and c[1] and c[2] and c[3] == 1 for c in calls), "a window or a target that cuDNN would copy"


def test_bad_inputs_are_refused_with_the_shape(vae):
    with pytest.raises(ValueError, match=r"4n\+1 frames.*\(1, 3, 4, 16, 16\)"):
        vae.encode(torch.zeros(1, 3, 4, 16, 16))
    with pytest.raises(ValueError, match="slice_frames must be a positive multiple of 4"):
        vae.encode(torch.zeros(1, 3, 5, 16, 16), slice_frames=3)
    with pytest.raises(ValueError, match=r"latents \[B, 16.*\(1, 4, 2, 2, 2\)"):
        vae.decode(torch.zeros(1, 4, 2, 2, 2))
    with pytest.raises(ValueError, match="slice_latents must be positive"):
        vae.decode(torch.zeros(1, 16, 2, 2, 2), slice_latents=0)
    with pytest.raises(ValueError, match="chunk_bytes must be positive"):
        vae.decode(torch.zeros(1, 16, 2, 2, 2), chunk_bytes=0)


def test_bf16_weights_run_in_bf16(vae):
    half = SeedVR2VAE(VAEConfig.tiny()).eval()
    half.load_state_dict(vae.state_dict())
    half.to(torch.bfloat16)
    z = T["dec.1.z"].float()
    out = half.decode(z)
    assert out.dtype == torch.bfloat16
    assert rel(out.float(), T["dec.1.out"]) < 3e-2


def test_rename_legacy_attention_keys():
    old = {"decoder.mid_block.attentions.0.query.weight": 1, "decoder.mid_block.attentions.0.proj_attn.bias": 2,
           "encoder.mid_block.attentions.0.key.bias": 3, "encoder.mid_block.attentions.0.group_norm.weight": 4,
           "encoder.conv_in.weight": 5}
    assert rename_legacy_keys(old) == {
        "decoder.mid_block.attentions.0.to_q.weight": 1, "decoder.mid_block.attentions.0.to_out.0.bias": 2,
        "encoder.mid_block.attentions.0.to_k.bias": 3, "encoder.mid_block.attentions.0.group_norm.weight": 4,
        "encoder.conv_in.weight": 5}
