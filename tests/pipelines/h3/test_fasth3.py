"""FastH3, FastVideo's 4-step student (issue 15 item 4; docs/FASTH3.md): the released adapter layout read strictly and
fused at load, the learned VSA gates (coarse branch), the 4-step schedule, the loader / CLI options, and the tiny
student through the whole pipeline against a float64 reference written here."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from comfyui_h3.backend.models.checkpoint import CheckpointError
from comfyui_h3.backend.models.tiny_fasth3 import make_tiny_fasth3
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.request import H3Request
from vsa_forward import assert_compiled_equals_eager

POSITIONS = (0.999, 0.749, 0.5, 0.25, 0.0)  # FastVideo's dmd_denoising_steps [999, 749, 500, 250] / 1000, then 0
SPEC = "vsa:topk=3,dense=1"  # step 0 dense, steps 1-3 sparse: 3 of the 10 tiles of a 64x128 clip


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    root = tmp_path_factory.mktemp("fasth3")
    return (make_tiny_fasth3(root / "vsa-datafree" / "adapter_model.safetensors"),
            make_tiny_fasth3(root / "dense-datafree" / "adapter_model.safetensors", gates=False))


def _t2va(**kw):
    kw = {"steps": 4, "schedule": "fasth3", **kw}
    return H3Request(prompt="thunder over hills", num_frames=124, seed=9, width=128, height=64, decode=False, **kw)


# -- the adapter: fusion and refusals ---------------------------------------------------------------------------------

def _split(key):
    for suffix, op, target in ((".lora_A.weight", "A", ".weight"), (".lora_B.weight", "B", ".weight"),
                               (".set_weight", "set", ".weight"), (".diff_b", "diff", ".bias"),
                               (".diff", "diff", ".weight")):
        if key.endswith(suffix):
            return key[: -len(suffix)] + target, op
    raise AssertionError(key)


def independent_fusion(base: dict, adapter_file) -> dict:
    """base state (name -> tensor) + the adapter, in float64, written from the release's stated reconstruction:
    W + lora_B @ lora_A, then .diff / .diff_b added, then .set_weight assigned."""
    parts: dict = {}
    for key, tensor in load_file(str(adapter_file)).items():
        target, op = _split(key)
        parts.setdefault(target, {})[op] = tensor.double()
    out = {k: v.double() for k, v in base.items()}
    for target, p in parts.items():
        if "set" in p:
            out[target] = p["set"]
            continue
        w = out[target]
        if "A" in p:
            w = w + p["B"] @ p["A"]
        out[target] = w + p.get("diff", 0)
    return out


def base_state(tiny_h3_dir) -> dict:
    from tiny_dit import folder_state

    return folder_state(tiny_h3_dir / "transformer")


def test_fusion_equals_base_plus_adapter_computed_independently(tiny_h3_dir, student):
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer

    gated, _ = student
    want = independent_fusion(base_state(tiny_h3_dir), gated)
    model = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, fuse=False, adapter=gated)
    got = model.state_dict()
    gates = [k for k in want if "to_gate_compress" in k]
    assert len(gates) == len(model.transformer_blocks) == 2 and model.vsa_gates
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == torch.float32
        assert torch.allclose(got[key].double(), value.float().double(), rtol=1e-6, atol=1e-7), key
    base = base_state(tiny_h3_dir)
    edited = {_split(k)[0] for k in load_file(str(gated))} - set(gates)
    assert len(edited) > 40 and all(not torch.equal(got[k], base[k].float()) for k in edited)
    assert all(torch.equal(got[k], base[k].float()) for k in base if k not in edited)
    # fused QKV GEMM: q, k, v and the gate rows, in that order
    fused = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, adapter=gated)
    attn = fused.transformer_blocks[1].attn
    names = [f"transformer_blocks.1.attn.{p}.weight" for p in ("to_q", "to_k", "to_v", "to_gate_compress")]
    assert torch.equal(attn.qkv_weight, torch.cat([got[n] for n in names]))
    # the refiner and the dense variant carry no gate
    assert fused.token_refiner.refiner_blocks[0].attn.to_gate_compress is None
    dense = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, adapter=student[1])
    assert not dense.vsa_gates and dense.transformer_blocks[0].attn.qkv_weight.shape[0] == 3 * 128


def test_fp8_storage_quantises_the_gate_with_qkv(tiny_h3_dir, student):
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer

    model = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.bfloat16, adapter=student[0],
                                storage="fp8_emulated")
    attn = model.transformer_blocks[0].attn
    assert attn.qkv_fp8 is not None and attn.qkv_fp8.out_features == 4 * 128


def _rewrite(src, dst, edit=None, metadata=None):
    with safe_open(str(src), framework="pt") as handle:
        meta = dict(handle.metadata())
    tensors = load_file(str(src))
    if edit is not None:
        edit(tensors)
    meta.update(metadata or {})
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst), metadata={k: v for k, v in meta.items() if v is not None})
    return dst


def _drop(suffix):
    def edit(tensors):
        del tensors[next(k for k in sorted(tensors) if k.endswith(suffix))]
    return edit


def _add(key, shape):
    def edit(tensors):
        tensors[key] = torch.zeros(shape)
    return edit


def _resize(key_end, shape):
    def edit(tensors):
        key = next(k for k in sorted(tensors) if k.endswith(key_end))
        tensors[key] = torch.zeros(shape)
    return edit


CASES = [
    ("format", None, {"format": "peft"}, "is not a FastH3 adapter: its metadata format is 'peft'"),
    ("unknown kind", _add("transformer_blocks.0.attn.to_q.alpha", (1,)), None, "no FastH3 adapter part"),
    ("unpaired", _drop("attn.to_k.lora_B.weight"), {"low_rank_tensors": None}, "its other half (up / B or down / A) is missing"),
    ("partial", _drop(".diff_b"), None, "declares diff_tensors=25 but carries 24"),
    ("rank", None, {"rank": "64"}, "declares rank 64 but its factors have rank 4"),
    ("foreign target", _add("transformer_blocks.7.attn.to_q.diff", (128, 48)), {"diff_tensors": "26"},
     "edits modules the H3 DiT has not got: transformer_blocks.7.attn.to_q.diff"),
    ("shape", _resize("transformer_blocks.0.ff.net.2.lora_B.weight", (40, 4)), None,
     "does not fit this H3 DiT: transformer_blocks.0.ff.net.2.lora_A.weight"),
    ("some gates", _drop("transformer_blocks.1.attn.to_gate_compress.set_weight"), {"set_weight_tensors": "1"},
     "sets learned VSA gates for 1 of the model's 2 blocks"),
]


@pytest.mark.parametrize("name,edit,metadata,message", CASES, ids=[c[0] for c in CASES])
def test_bad_or_partial_adapters_are_refused_naming_the_file(tiny_h3_dir, student, tmp_path, name, edit, metadata,
                                                             message):
    """Each refusal is one line naming the file and the first offending tensors, before any weight moves (the
    engine config check) and again at load."""
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer

    bad = _rewrite(student[0], tmp_path / "bad" / "adapter_model.safetensors", edit, metadata)
    config = h3_config(str(tiny_h3_dir), dtype="float32", attention="vsa", student=str(bad))
    with pytest.raises(CheckpointError) as caught:
        config.validate()
    assert message in str(caught.value) and str(bad) in str(caught.value)
    with pytest.raises(CheckpointError, match="FastH3|fit|edits|declares|other half|gates"):
        load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, adapter=bad)


def test_files_and_folders_that_are_no_single_adapter(tiny_h3_dir, student, tmp_path):
    from comfyui_h3.backend.models.fasth3 import read_adapter

    with pytest.raises(CheckpointError, match="not found"):
        read_adapter(tmp_path / "missing.safetensors")
    pickle = tmp_path / "adapter.bin"
    pickle.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="safetensors only"):
        read_adapter(pickle)
    with pytest.raises(CheckpointError, match=r"several FastH3 variants \(dense-datafree, vsa-datafree\)"):
        read_adapter(student[0].parent.parent)  # the release's folder: point at one variant
    assert read_adapter(student[0].parent).path == student[0]  # a variant's folder: its adapter_model.safetensors
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(student[0].read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="cut.safetensors"):
        read_adapter(cut)
    with pytest.raises(ValueError, match="carries learned VSA gates .* choose attention vsa"):
        h3_config(str(tiny_h3_dir), dtype="float32", student=str(student[0])).validate()
    h3_config(str(tiny_h3_dir), dtype="float32", student=str(student[1])).validate()  # no gates: any attention


# -- the coarse branch and the schedule -------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: there the sparse steps run the Triton kernel (the CPU "
                                          "case runs the same rule through the torch fallback)"))])
def test_coarse_branch_matches_the_float64_rule(device):
    """vsa._attend with learned gates (sparse and dense steps) equals the rule's float64 reference; a zero gate
    adds nothing."""
    from comfyui_h3.backend.attention.vsa import _attend
    from comfyui_h3.backend.attention.vsa_kernel import reference
    from comfyui_h3.backend.attention.vsa_plan import VSAPlan, VSASettings, tile_order

    torch.manual_seed(5)
    _, sizes = tile_order((5, 6, 7))
    prefix = torch.tensor([64, 36, 64, 64, 2])  # two segments: 100 text rows, 130 audio rows
    p = int(prefix.sum())
    s = p + int(sizes.sum())
    plan = VSAPlan(torch.arange(s), torch.arange(s), p, sizes, (5, 6, 7), VSASettings(topk=3), prefix_sizes=prefix)
    qkvg = [torch.randn(1, s, 2, 32, device=device) for _ in range(4)]
    # bf16: the fine output is rounded once, then the sum once more (FastVideo rounds three times): <= 3e-3
    for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 3e-3)):
        q, k, v, gate = (x.to(dtype) for x in qkvg)
        for step in (plan, plan.dense()):
            topk = plan.topk if step.sparse else plan.num_tiles
            host = [x.cpu() for x in (q, k, v)]
            want, _ = reference(*host, p, sizes, topk, gate=gate.cpu(), prefix_sizes=prefix)
            got = _attend(q, k, v, step, gate).cpu()
            assert got.dtype == dtype and rel_err(got, want) <= bound, (dtype, step.sparse)
            plain, _ = reference(*host, p, sizes, topk)
            assert rel_err(plain, want) > 0.05  # the branch matters
            assert torch.equal(_attend(q, k, v, step, torch.zeros_like(gate)), _attend(q, k, v, step))
    with pytest.raises(ValueError, match="need the request's VSA plan"):
        _attend(q, k, v, None, gate)


def test_prefix_blocks_never_mix_modalities():
    from comfyui_h3.backend.attention.vsa_plan import make_plan
    from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry
    from comfyui_h3.backend.pipelines.h3.layout import build_layout

    layout = build_layout(torch.ones(70, dtype=torch.long), resolve_geometry(124, 64, 128), (1, 2, 2), ())
    plan = make_plan(layout)
    audio = layout.audio_indices.numel()
    assert layout.token_tags[:70].eq(1).all() and layout.token_tags[70:70 + audio].eq(2).all()
    assert plan.prefix_sizes.tolist() == [64, 6] + [64] * (audio // 64) + [audio % 64]  # text, then audio
    assert int(plan.block_sizes.sum()) == layout.seq_len
    assert plan.block_sizes.numel() == plan.prefix_sizes.numel() + plan.num_tiles


def test_the_fasth3_ladder():
    from comfyui_h3.backend.pipelines.h3.geometry import RequestError
    from comfyui_h3.backend.pipelines.h3.schedule import DualSchedule

    sched = DualSchedule.named("fasth3", 4, 12.0, 3.0)
    for sigmas, shift in ((sched.video_sigmas, 12.0), (sched.audio_sigmas, 3.0)):
        want = torch.tensor([shift * u / (1 + (shift - 1) * u) for u in POSITIONS], dtype=torch.float64)
        assert sigmas.dtype == torch.float32 and torch.allclose(sigmas.double(), want, rtol=1e-6, atol=0)
    assert sched.num_evaluations == 4 and float(sched.video_t(0)) == pytest.approx(1 - 11.988 / 11.989, abs=1e-6)
    assert torch.equal(DualSchedule.named("default", 50, 12.0, 3.0).video_sigmas,
                       DualSchedule.make(51, 12.0, 3.0).video_sigmas)
    with pytest.raises(RequestError, match="set steps to 4"):
        _t2va(steps=50).validate()
    with pytest.raises(RequestError, match="schedule must be one of"):
        _t2va(schedule="lcm").validate()


# -- the tiny student through the pipeline, against a float64 reference -----------------------------------------------

class PackedVSA:
    """The VSA rule with the coarse branch in float64, on rows in PACKED order (no plan, no permutation): tiles and
    prefix blocks are found here from the layout. `sparse` is set per step."""

    def __init__(self, layout, topk: int):
        self.topk, self.sparse, self.seq = topk, False, layout.seq_len
        target = layout.video_indices[layout.num_condition_video_rows:]
        pos = layout.position_ids[target]
        hp, wp = torch.unique(pos[:, 1]).numel(), torch.unique(pos[:, 2]).numel()
        r = torch.arange(target.numel())  # target rows are frame-major, row-major over the latent grid
        cell = torch.stack([r // (hp * wp) // 4, (r // wp) % hp // 4, r % wp // 4], dim=1)
        tiles, tile = torch.unique(cell, dim=0, return_inverse=True)
        is_target = torch.zeros(self.seq, dtype=torch.bool)
        is_target[target] = True
        self.tile_of = torch.full((self.seq,), -1)
        self.tile_of[target] = tile
        self.num_tiles = tiles.shape[0]
        block = torch.full((self.seq,), -1)
        prefix = torch.nonzero(~is_target).reshape(-1)
        tags, n, prev, run = layout.token_tags[prefix].tolist(), -1, None, 0
        for i, row in enumerate(prefix.tolist()):
            if tags[i] != prev or run == 64:
                n, run, prev = n + 1, 0, tags[i]
            block[row], run = n, run + 1
        block[target] = n + 1 + tile
        self.block_of = block
        self.prefix = ~is_target

    @staticmethod
    def _means(x, groups, count):  # x [B, S, H, D] -> [B, H, count, D]
        return torch.stack([x[:, groups == g].mean(1) for g in range(count)], dim=2)

    def __call__(self, q, k, v, gate=None):
        q, k, v = q.double(), k.double(), v.double()
        scale = q.shape[-1] ** -0.5
        scores = torch.einsum("bshd,bthd->bhst", q, k) * scale
        if q.shape[1] == self.seq and self.sparse:
            qt = self._means(q, self.tile_of, self.num_tiles)
            kt = self._means(k, self.tile_of, self.num_tiles)
            sel = torch.topk(qt @ kt.transpose(-1, -2), self.topk, dim=-1).indices  # [B, H, T, k]
            allowed = torch.zeros(scores.shape, dtype=torch.bool)
            allowed[:, :, self.prefix] = True
            allowed[:, :, :, self.prefix] = True
            for i in range(self.num_tiles):
                rows = torch.nonzero(self.tile_of == i).reshape(-1)
                for b in range(q.shape[0]):
                    for h in range(q.shape[2]):
                        keys = torch.isin(self.tile_of, sel[b, h, i])
                        allowed[b, h, rows[:, None], torch.nonzero(keys).reshape(-1)[None]] = True
            scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.einsum("bhst,bthd->bshd", torch.softmax(scores, -1), v)
        if gate is not None:
            count = int(self.block_of.max()) + 1
            qb, kb, vb = (self._means(x, self.block_of, count) for x in (q, k, v))
            coarse = torch.softmax(qb @ kb.transpose(-1, -2) * scale, -1) @ vb  # [B, H, N, D]
            out = out + coarse[:, :, self.block_of].transpose(1, 2) * gate.double()
        return out


def reference_rows(tiny_h3_dir, adapter, inputs, topk=3, dense_steps=1, gates=True):
    """The 4 student steps in float64: the base DiT with the adapter fused here, the PackedVSA rule, the ladder's
    sigmas and the Euler update of the released sampler (x0 = x + sigma * v; x <- r x + (1 - r) x0, r = s'/s)."""
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer

    layout, text, video, audio = inputs
    model = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, fuse=False).double()
    fused = independent_fusion(model.state_dict(), adapter)
    model.load_state_dict({k: v for k, v in fused.items() if "to_gate_compress" not in k})
    if gates:
        for i, block in enumerate(model.transformer_blocks):
            block.attn.add_gate(fused[f"transformer_blocks.{i}.attn.to_gate_compress.weight"])
    attention = PackedVSA(layout, topk)
    model.attention = attention
    sigma_v = [12 * u / (1 + 11 * u) for u in POSITIONS]
    sigma_a = [3 * u / (1 + 2 * u) for u in POSITIONS]
    video, audio, text = video.double().clone(), audio.double().clone(), text.double()
    for i in range(4):
        attention.sparse = i >= dense_steps
        t = torch.full((layout.seq_len,), 1 - sigma_v[i], dtype=torch.float64)
        t[layout.audio_indices] = 1 - sigma_a[i]
        ts, index = torch.unique(t, sorted=True, return_inverse=True)
        with torch.no_grad():
            v_pred, a_pred = model(video[None], audio[None], text, ts, index, layout.token_tags, layout.position_ids,
                                   layout.video_indices, layout.audio_indices, layout.text_indices)
        for rows, pred, sig in ((video, v_pred[0], sigma_v), (audio, a_pred[0], sigma_a)):
            x0 = rows + sig[i] * pred
            ratio = sig[i + 1] / sig[i]
            rows.copy_(ratio * rows + (1 - ratio) * x0)
    return video, audio


def run_capturing(pipe, request):
    """Run the pipeline, keeping what its denoise driver got (layout, text, initial rows) and returned."""
    seen = {}
    denoise = pipe.denoise

    def spy(dit, plan, video, audio, *args, **kwargs):
        seen["inputs"] = (plan.layout, plan.text.cpu(), video.cpu().clone(), audio.cpu().clone())
        out = denoise(dit, plan, video, audio, *args, **kwargs)
        seen["rows"] = tuple(x.cpu().clone() for x in out)
        return out

    pipe.denoise = spy
    result = pipe.run(request)
    return result, seen


@pytest.mark.slow
def test_four_steps_of_the_tiny_student_equal_a_float64_reference(tiny_h3_dir, student):
    """The tiny student (its adapter fused at load, learned gates, VSA one dense step then top-3 of 10 tiles) on the
    fasth3 ladder, t2va in float32, equals the float64 reference written here; the reference without the gates, or
    all dense, is far off, so each part is exercised."""
    pipe = h3_config(str(tiny_h3_dir), dtype="float32", attention=SPEC, student=str(student[0])).build_pipeline(0)
    seen = run_capturing(pipe, _t2va())[1]
    video, audio = seen["rows"]
    want_v, want_a = reference_rows(tiny_h3_dir, student[0], seen["inputs"])
    # 1e-5: tight enough to tell the ladder from FastVideo's plain 5-point grid (1, 0.75, ...: ~1e-4 off here)
    assert rel_err(video, want_v) < 1e-5 and rel_err(audio, want_a) < 1e-5
    no_gates = reference_rows(tiny_h3_dir, student[0], seen["inputs"], gates=False)
    all_dense = reference_rows(tiny_h3_dir, student[0], seen["inputs"], dense_steps=4)
    for other in (no_gates, all_dense):
        assert rel_err(video, other[0]) > 1e-3


def test_student_engines_run_t2va_on_the_ladder_only(tiny_h3_dir, student):
    from comfyui_h3.backend.pipelines.h3.geometry import RequestError

    pipe = h3_config(str(tiny_h3_dir), dtype="float32", attention=SPEC, student=str(student[0])).build_pipeline(0)
    with pytest.raises(RequestError, match="schedule fasth3, steps 4"):
        pipe.run(_t2va(steps=4, schedule="default"))
    from PIL import Image

    with pytest.raises(RequestError, match="distilled for text-to-video only"):
        pipe.run(_t2va(first_frame=Image.new("RGB", (128, 64))))
    assert pipe.c.carries_student("t2va") and not pipe.c.carries_student("ref2va")  # transformer_ref stays base


@pytest.mark.slow
def test_two_gloo_ranks_with_the_student_equal_one_rank(tiny_h3_dir, student):
    """Ulysses splits the heads; the gates travel with q, k, v, so 2 ranks give one rank's result."""
    from comfyui_h3.backend.engine import Engine

    want = h3_config(str(tiny_h3_dir), dtype="float32", attention=SPEC,
                     student=str(student[0])).build_pipeline(0).run(_t2va())
    eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1, attention=SPEC,
                           student=str(student[0])))
    try:
        got = eng.generate(_t2va())
    finally:
        eng.shutdown()
    assert rel_err(got.video_latents, want.video_latents) < 1e-5
    assert rel_err(got.audio_latents, want.audio_latents) < 1e-5


# -- the loader node and the CLI --------------------------------------------------------------------------------------

def test_loader_student_option_reaches_the_engine(tiny_h3_dir, student, tmp_path, monkeypatch):
    from comfyui_h3.comfy_services.errors import UnsafePathError
    from comfyui_h3.nodes import loader

    root = tmp_path / "models"
    target = root / "FastH3-4-step" / "vsa-datafree" / "adapter_model.safetensors"
    target.parent.mkdir(parents=True)
    target.write_bytes(student[0].read_bytes())
    (root / "other-lora.safetensors").write_bytes(b"x")  # not named after FastH3: not listed
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(root))
    monkeypatch.setattr(loader, "ensure_tiny_model", lambda: tiny_h3_dir)
    monkeypatch.setattr(loader, "ensure_tiny_student", lambda: student[0])
    spec = loader.H3ModelLoader.INPUT_TYPES()
    optional = list(spec["optional"])  # appended after the widgets saved workflows already have, in this order
    assert optional[:6] == ["adaln_cache", "weights", "resident_blocks", "vsa_topk", "vsa_dense_steps", "student"]
    kind, opts = spec["optional"]["student"]
    assert kind == ["none", loader.TINY_STUDENT_NAME, "FastH3-4-step/vsa-datafree/adapter_model.safetensors"]
    assert opts["default"] == "none" and opts["tooltip"]
    load = loader.H3ModelLoader().load
    assert load(loader.TINY_NAME, "cpu", "float32", "vsa")[0].config.options.student is None
    handle = load(loader.TINY_NAME, "cpu", "float32", "vsa", student=loader.TINY_STUDENT_NAME)[0]
    assert handle.config.options.student == str(student[0].resolve())
    listed = load(loader.TINY_NAME, "cpu", "float32", "vsa", student=kind[2])[0]
    assert listed.config.options.student == str(target.resolve())
    with pytest.raises(ValueError, match="choose attention vsa"):
        load(loader.TINY_NAME, "cpu", "float32", "sdpa", student=loader.TINY_STUDENT_NAME)
    with pytest.raises(UnsafePathError):
        load(loader.TINY_NAME, "cpu", "float32", "vsa", student="../x/adapter_model.safetensors")


def test_sample_node_schedule_widget_reaches_the_request(monkeypatch):
    from comfyui_h3.nodes import sample

    optional = sample.H3Sample.INPUT_TYPES()["optional"]
    names = list(optional)
    assert optional["schedule"][0] == ["default", "fasth3", "turbo"]
    # after it only the inputs appended later (the native LATENT where ComfyUI has one, the strength start, the cache)
    assert [n for n in names[names.index("schedule") + 1:] if n != "native_latent"] == [
        "source_latents", "source_video", "denoise", "source_audio", "step_cache"]
    seen = []

    def run_engine(handle, request, *args, **kwargs):
        seen.append(request)
        raise RuntimeError("stop")

    monkeypatch.setattr(sample, "run_engine", run_engine)
    with pytest.raises(RuntimeError, match="stop"):
        sample.H3Sample().sample(None, "a fox", 5.0, 0, 0, 4, 0.0, 0.0, 1, schedule="fasth3")
    assert seen[0].schedule == "fasth3" and seen[0].steps == 4


@pytest.mark.parametrize("flags,schedule,steps", [([], "default", 50), (["--fasth3", "STUDENT"], "fasth3", 4),
                                                  (["--fasth3", "STUDENT", "--schedule", "default"], "default", 50),
                                                  (["--schedule", "fasth3"], "fasth3", 4)])
def test_cli_schedule_and_steps(flags, schedule, steps, student):
    from comfyui_h3.cli import _parser
    from comfyui_h3.cli_generate import build_request

    flags = [str(student[0]) if f == "STUDENT" else f for f in flags]
    request = build_request(_parser().parse_args(["generate", "--prompt", "x"] + flags))
    assert (request.schedule, request.steps) == (schedule, steps)


def test_cli_fasth3_flag_reaches_the_engine_config(monkeypatch, student):
    from cli_engine_configs import engine_configs_for

    configs = engine_configs_for(monkeypatch, ["--fasth3", str(student[0].parent), "--attention", "vsa"], _t2va())
    assert len(configs) == 3 and all(c.options.student == str(student[0].resolve()) for c in configs)
    assert all(c.options.student is None for c in engine_configs_for(monkeypatch, [], _t2va()))


def test_cli_tiny_student_is_built_into_the_cache(tmp_path, monkeypatch):
    from comfyui_h3.cli import _parser
    from comfyui_h3.cli_generate import student_file

    monkeypatch.setenv("COMFYUI_H3_CACHE", str(tmp_path))
    path = student_file(_parser().parse_args(["generate", "--prompt", "x", "--fasth3", "tiny"]))
    assert path == str(tmp_path / "tiny-fasth3" / "vsa-datafree" / "adapter_model.safetensors")
    from comfyui_h3.backend.models.fasth3 import read_adapter

    assert read_adapter(path).has_gates
    assert student_file(_parser().parse_args(["generate", "--prompt", "x"])) is None


@pytest.mark.slow
def test_shipped_fasth3_workflow_runs_on_the_tiny_model(tmp_path, tiny_h3_dir):
    """example_workflows/api/h3_fasth3_text_to_video.api.json through `run` (checked as ComfyUI checks a prompt):
    the tiny model with the tiny student, VSA, schedule fasth3, 4 steps -> a 5-s MP4 with its sound."""
    from cli_helpers import run_shipped_4_step_workflow

    run_shipped_4_step_workflow("h3_fasth3_text_to_video", tmp_path, tiny_h3_dir.parent)


def test_compiled_blocks_with_gates_equal_eager(tiny_h3_dir, student):
    """On CUDA the engine compiles each block: the gate rows of the fused QKV GEMM and the coarse branch (eager,
    a graph break like the sparse kernel) compute what the eager blocks do, on a sparse and a dense step."""
    from comfyui_h3.backend.attention.vsa_plan import VSASettings, make_plan
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer
    from comfyui_h3.backend.pipelines.h3.components import compile_blocks
    from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry
    from comfyui_h3.backend.pipelines.h3.layout import build_layout

    eager, compiled = (load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, attention=SPEC,
                                           adapter=student[0]) for _ in range(2))
    compile_blocks(compiled)
    layout = build_layout(torch.tensor([1, 1, 0, 1]), resolve_geometry(124, 64, 128), (1, 2, 2), ())
    plan = make_plan(layout, VSASettings(topk=3))
    assert_compiled_equals_eager(eager, compiled, layout, plan)


@pytest.mark.slow
@pytest.mark.parametrize("policy", [dict(adaln="cache"), dict(placement="offload", resident_blocks=0)],
                         ids=["adaln_cache", "offload"])
def test_student_under_the_weight_policies_equals_resident(tiny_h3_dir, student, policy):
    """The adapter is fused as the weights load, before the AdaLN cache takes the projections or the offload
    placement homes the blocks on the host: both run the same student, bit for bit."""
    from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy as WeightPolicy

    def run(**weights):
        return h3_config(str(tiny_h3_dir), dtype="float32", attention=SPEC, student=str(student[0]),
                         weights=WeightPolicy(**weights)).build_pipeline(0).run(_t2va())

    want, got = run(), run(**policy)
    assert torch.equal(got.video_latents, want.video_latents) and torch.equal(got.audio_latents, want.audio_latents)
