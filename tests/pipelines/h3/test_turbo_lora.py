"""LightX2V Turbo LoRAs: their contracts from the released names, the release's alpha for the alpha-less PEFT copies
(`.lora_A.default.weight` keys), and the turbo schedule: their grid filled in, refused where it does not fit."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from comfyui_h3.backend.models.checkpoint import meta_shapes
from comfyui_h3.backend.models.h3_transformer import H3Transformer, H3TransformerConfig, load_h3_transformer
from comfyui_h3.backend.models.lora import lora_choice, read_lora
from comfyui_h3.backend.models.turbo_lora import release_scale, turbo_contract
from comfyui_h3.backend.pipelines.h3.geometry import RequestError
from comfyui_h3.backend.pipelines.h3.schedule import DualSchedule
from h3_requests import t2va
from tiny_dit import folder_state

FL2V_4 = "minimax_h3_fl2v_turbo_4step_v1.1_768p_bf16.safetensors"


@pytest.fixture(scope="module")
def shapes(tiny_h3_dir):
    cfg = H3TransformerConfig.from_json(tiny_h3_dir / "transformer" / "config.json")
    return meta_shapes(lambda: H3Transformer(cfg))


@pytest.mark.parametrize("name,passes,shift,alpha", [
    (FL2V_4, 4, 6.0, 128.0),
    ("minimax_h3_fl2v_turbo_4step_v1.2_768p_bf16.safetensors", 4, 6.0, 8.0),
    ("minimax_h3_fl2v_turbo_8step_v1.0_bf16.safetensors", 8, 12.0, 8.0),
    ("MiniMax_H3_Ref2V_Turbo_4step_v0.1_bf16.safetensors", 4, 12.0, 8.0),
    ("minimax_h3_ref2v_turbo_8step_v1.0_768p_comfyui_bf16.safetensors", 8, 6.0, 8.0),
])
def test_released_names_give_their_contracts(name, passes, shift, alpha):
    contract = turbo_contract(name)
    assert (contract.passes, contract.video_shift, contract.audio_shift, contract.alpha) == (passes, shift, 3.0, alpha)
    assert release_scale(name, 128) == (None if "comfyui" in name else alpha / 128)


@pytest.mark.parametrize("name", ["my_style.safetensors", "minimax_h3_turbo_4step.safetensors",
                                  "minimax_h3_fl2v_turbo_4step_v9.9_768p_bf16.safetensors"])
def test_other_files_have_no_contract(name):
    assert turbo_contract(name) is None and release_scale(name, 128) is None


def _peft_default_file(path, shapes, seed=5, rank=4, alpha=None):
    """A PEFT state dict as LightX2V ships its Turbo files: `<module>.lora_A.default.weight`, no alpha tensors."""
    gen = torch.Generator().manual_seed(seed)
    factors, tensors = {}, {}
    for m in ("transformer_blocks.0.attn.to_q", "transformer_blocks.1.ff.net.2"):
        out, inp = shapes[m + ".weight"]
        a, b = torch.randn(rank, inp, generator=gen), torch.randn(out, rank, generator=gen)
        factors[m] = (a, b)
        tensors[f"{m}.lora_A.default.weight"], tensors[f"{m}.lora_B.default.weight"] = a, b
        if alpha is not None:
            tensors[f"{m}.alpha"] = torch.tensor(float(alpha))
    save_file(tensors, str(path))
    return factors


@pytest.mark.parametrize("name,alpha_tensor,scale", [
    (FL2V_4, None, 128.0 / 4),  # the release's alpha over the file's rank
    ("minimax_h3_fl2v_turbo_4step_v1.1_768p_comfyui_bf16.safetensors", None, 1.0),  # a ComfyUI copy: its own
    (FL2V_4, 2.0, 2.0 / 4),  # the file's own alpha wins
    ("style.safetensors", None, 1.0),
])
def test_turbo_peft_files_merge_at_the_release_scale(tiny_h3_dir, shapes, tmp_path, name, alpha_tensor, scale):
    path = tmp_path / name
    factors = _peft_default_file(path, shapes, alpha=alpha_tensor)
    assert len(read_lora(path, shapes).edits) == 2
    model = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, fuse=False,
                                loras=[lora_choice(path, 0.5)])
    base, state = folder_state(tiny_h3_dir / "transformer"), model.state_dict()
    for m, (a, b) in factors.items():
        want = base[m + ".weight"].double() + 0.5 * scale * (b.double() @ a.double())
        assert torch.allclose(state[m + ".weight"].double(), want, rtol=0, atol=1e-5 * want.abs().max().item()), m


class _Choice:
    def __init__(self, path, strength=1.0):
        self.path, self.strength = path, strength


def test_the_turbo_grid_is_the_default_grid_at_the_files_steps_and_shifts():
    from comfyui_h3.backend.pipelines.h3.turbo import turbo_request

    req = turbo_request(t2va(steps=4, schedule="turbo"), [_Choice("/m/" + FL2V_4)])
    assert (req.steps, req.video_shift, req.audio_shift) == (4, 6.0, 3.0)
    turbo, plain = DualSchedule.named("turbo", 4, 6.0, 3.0), DualSchedule.named("default", 4, 6.0, 3.0)
    assert torch.equal(turbo.video_sigmas, plain.video_sigmas) and turbo.num_evaluations == 4
    # ModelTC's published 4-pass grid at shift 12 / 3 (its README's worked example)
    grid = DualSchedule.named("turbo", 4, 12.0, 3.0)
    assert torch.allclose(grid.video_sigmas, torch.tensor([1, 0.9730, 0.9231, 0.8000, 0]), atol=1e-4)
    assert torch.allclose(grid.audio_sigmas, torch.tensor([1, 0.9, 0.75, 0.5, 0]), atol=1e-6)
    kept = turbo_request(t2va(steps=4, schedule="turbo", video_shift=9.0), [_Choice(FL2V_4)])
    assert kept.video_shift == 9.0  # a shift the user set stays


def test_turbo_refusals():
    from comfyui_h3.backend.pipelines.h3.turbo import turbo_request

    with pytest.raises(RequestError, match="none of this engine's LoRAs is one"):
        turbo_request(t2va(steps=4, schedule="turbo"), [_Choice("style.safetensors")])
    with pytest.raises(RequestError, match="none of this engine's LoRAs"):
        turbo_request(t2va(steps=4, schedule="turbo"), [_Choice(FL2V_4, 0.0)])  # at strength 0 it is not applied
    with pytest.raises(RequestError, match="distilled for 4 steps: set steps to 4"):
        turbo_request(t2va(steps=50, schedule="turbo"), [_Choice(FL2V_4)])
    with pytest.raises(RequestError, match="different grids"):
        turbo_request(t2va(steps=4, schedule="turbo"),
                      [_Choice(FL2V_4), _Choice("minimax_h3_fl2v_turbo_8step_v1.0_bf16.safetensors")])


def test_a_turbo_request_equals_the_default_grid_it_stands_for(tiny_h3_dir, shapes, tmp_path):
    """On an engine carrying a Turbo-named LoRA, schedule turbo == schedule default at the file's steps and shifts,
    bitwise; without such a LoRA the engine refuses it before any step."""
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    path = tmp_path / FL2V_4
    _peft_default_file(path, shapes, rank=2)
    pipe = h3_config(str(tiny_h3_dir), dtype="float32", loras=[(path, 0.3)]).build_pipeline(0)
    got = pipe.run(t2va(steps=4, schedule="turbo"))
    want = pipe.run(t2va(steps=4, video_shift=6.0, audio_shift=3.0))
    assert torch.equal(got.video_latents, want.video_latents) and torch.equal(got.audio_latents, want.audio_latents)
    assert got.manifest["request"]["schedule"] == {"name": "turbo", "video_shift": 6.0, "audio_shift": 3.0}
    plain = h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)
    with pytest.raises(RequestError, match="turbo schedule"):
        plain.run(t2va(steps=4, schedule="turbo"))


@pytest.mark.parametrize("flags,want", [
    (["--lora", f"/x/{FL2V_4}:0.8"], ("turbo", 4)),
    (["--lora", "/x/minimax_h3_fl2v_turbo_8step_v1.0_bf16.safetensors"], ("turbo", 8)),
    (["--lora", "/x/style.safetensors"], ("default", 50)),
    (["--lora", f"/x/{FL2V_4}", "--schedule", "default", "--steps", "6"], ("default", 6)),
])
def test_cli_picks_the_turbo_schedule_for_a_turbo_lora(flags, want):
    from comfyui_h3.cli import _parser
    from comfyui_h3.cli_generate import sampling_plan

    args = _parser().parse_args(["generate", "--prompt", "x", *flags])
    assert sampling_plan(args) == want


@pytest.mark.slow
def test_shipped_turbo_workflow_runs_on_the_tiny_model(tmp_path, tiny_h3_dir):
    """example_workflows/api/h3_turbo_text_to_video.api.json through `run`: the tiny model, H3 LoRA with the tiny
    Turbo-named LoRA, schedule turbo at its 4 steps -> a 5-s MP4 with its sound and a manifest naming the LoRA and
    the turbo grid."""
    import json

    from cli_helpers import run_shipped_4_step_workflow

    path = run_shipped_4_step_workflow("h3_turbo_text_to_video", tmp_path, tiny_h3_dir.parent)
    with open(path + ".manifest.json") as handle:
        manifest = json.load(handle)
    assert manifest["request"]["schedule"] == {"name": "turbo", "video_shift": 6.0, "audio_shift": 3.0}
    assert manifest["request"]["steps"] == 4
    (lora,) = manifest["engine"]["loras"]
    assert lora["file"].endswith("tiny_h3_fl2v_turbo_4step_v1.1_768p_bf16.safetensors") and lora["strength"] == 1.0
