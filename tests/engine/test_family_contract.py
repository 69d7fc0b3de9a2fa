"""The contract every model family meets, run for each through the same engine (as diffusers' model tester mixins
run one battery over every model): its config checks before a process starts and reports the memory a rank holds;
a request runs on 1 rank and on 2 gloo ranks with the same result (to the family's stated tolerance); Stop comes back
as EngineCancelled at a step boundary and the loaded engine then serves the next request; a bad request is one
RequestError line naming the input and leaves the engine working; the result carries the stage manifest. A new
family adds one `Case` below."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch

from comfyui_h3.backend.engine import EngineCancelled, get_engine
from comfyui_h3.backend.engine_config import EngineConfig
from comfyui_h3.backend.errors import RequestError

pytestmark = pytest.mark.slow  # engines on 1 and 2 processes per family: minutes on two cores


@dataclass(frozen=True)
class Case:
    name: str
    config: Callable[[Any, int], EngineConfig]  # (model folder, world) -> config
    request: Callable[[], Any]  # a small request every rank count runs
    bad: Callable[[], Any]  # a request refused at the boundary
    refusal: str  # what the refusal names
    output: Callable[[Any], torch.Tensor]  # the result's numbers compared across rank counts
    atol: float  # 0: bitwise
    slow_request: Callable[[], Any]  # a request long enough that Stop lands at a step boundary


def _h3_config(folder, world):
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    return h3_config(str(folder), device="cpu", dtype="float32", world_size=world)


def _h3_request(steps=2):
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    return H3Request(prompt="a dog barks", num_frames=124, width=64, height=64, steps=steps, seed=3)


def _h3_bad():
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    return H3Request(prompt="a dog barks", num_frames=124, width=64, height=64, steps=0)


def _seedvr2_config(folder, world):
    from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE
    from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config

    return seedvr2_config(folder / DIT_FILE.format(variant="3b"), folder / VAE_FILE, folder / TEXT_FILE,
                          dtype="float32", vae_dtype="float32", device="cpu", world_size=world)


def _frames(count: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (count, 24, 40, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _seedvr2_request(frames=9):
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    return UpscaleRequest(_frames(frames), scale=2.0, batch_frames=5, overlap=1, seed=4)


def _seedvr2_bad():
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    return UpscaleRequest(_frames(5), scale=2.0, batch_frames=6)


CASES = [
    # H3: Ulysses over 2 ranks equals 1 rank to float32 rounding (the attention's sums split by heads)
    Case("h3", _h3_config, _h3_request, _h3_bad, "steps must be between 1 and 1000, got 0",
         lambda r: r.video_latents, 1e-4, lambda: _h3_request(steps=40)),
    # SeedVR2: whole windows per rank; only the DiT's text sums run in another order
    Case("seedvr2", _seedvr2_config, _seedvr2_request, _seedvr2_bad, r"Batch frames must be 4n\+1",
         lambda r: r.frames.float(), 1.0, lambda: _seedvr2_request(frames=41)),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_h3_dir):
    from comfyui_h3.backend.models.seedvr2.tiny import make_tiny_seedvr2

    return {"h3": tiny_h3_dir, "seedvr2": make_tiny_seedvr2(tmp_path_factory.mktemp("tiny") / "m", "3b")}


@pytest.fixture(autouse=True)
def _clean_registry(empty_engine_registry):
    yield


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_family_contract(case, folders):
    one, two = case.config(folders[case.name], 1), case.config(folders[case.name], 2)
    for config in (one, two):
        config.validate()  # before any process
        assert config.family == case.name and config.family_impl().memory_bytes(config) > 0

    single = get_engine(one).generate(case.request())
    assert single.manifest and single.manifest.get("stages"), case.name
    pair = get_engine(two)
    both = pair.generate(case.request())
    a, b = case.output(single), case.output(both)
    assert a.shape == b.shape and torch.isfinite(a).all()
    assert (torch.equal(a, b) if case.atol == 0 else torch.allclose(a, b, rtol=0, atol=case.atol)), \
        (case.name, (a - b).abs().max().item())

    with pytest.raises(RequestError, match=case.refusal) as refused:
        pair.generate(case.bad())
    assert "\n" not in str(refused.value)
    with pytest.raises(EngineCancelled):
        pair.generate(case.slow_request(), should_cancel=lambda: True)
    again = pair.generate(case.request())  # the loaded engine serves the next request, the same numbers
    assert torch.equal(case.output(again), b)
