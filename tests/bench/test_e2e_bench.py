"""bench/e2e.py --sp N on CPU ranks (gloo, --tiny configs): the whole T2VA request under Ulysses sequence parallelism
on 2 ranks gives the 1-rank run's result (ours through the engine worker's setup_rank and ParallelContext; diffusers
through its own context parallelism), every rank holding the same random weights; a run that cannot finish stops
every rank; a degree that does not divide the heads is one line before any rank starts."""

import json
import os
import subprocess
import sys
import uuid

import pytest
import torch
from repo_paths import REPO_DIR

pytestmark = pytest.mark.slow  # every test here takes seconds on two cores (docs/TESTING.md)

BENCH = os.path.join(REPO_DIR, "bench", "e2e.py")


def _bench(tmp_path, name, *args, env=None, timeout=600):
    """(completed process, JSON result, --outputs digest); the last two None when the run failed."""
    out, js = tmp_path / f"{name}.pt", tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, BENCH, "--tiny", *args, "--outputs", str(out), "--json", str(js)],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    if done.returncode != 0:
        return done, None, None
    return done, json.loads(js.read_text()), torch.load(out)


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("side", [["ours"], ["ours", "--fasth3"], ["diffusers"]], ids=["ours", "ours-fasth3",
                                                                                       "diffusers"])
def test_sp2_equals_one_rank(tmp_path, side):
    """--fasth3 also builds random learned VSA gates, drawn after rank 0 alone has built the text encoder: they must
    not come from the global RNG (each rank's state differs there), which the run's weight check refuses."""
    one, one_js, one_out = _bench(tmp_path, "one", "--side", *side)
    two, two_js, two_out = _bench(tmp_path, "two", "--side", *side, "--sp", "2")
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    assert (one_js["sp_degree"], two_js["sp_degree"]) == (1, 2)
    assert two_js["video"] == one_js["video"]
    assert two_out["frames_shape"] == one_out["frames_shape"] == [124, 64, 64, 3]
    # the decoded video (its clips shared by the ranks) and the soundtrack: within float error of one rank (uint8
    # frames: a rounding flip moves a frame's mean by 1/12288)
    assert (two_out["frame_means"] - one_out["frame_means"]).abs().max().item() <= 0.05
    assert _rel(two_out["audio"], one_out["audio"]) <= 1e-5
    if side[0] == "ours":  # the denoised result itself; float32, so equal within float tolerance
        for key in ("video_latents", "audio_latents"):
            assert _rel(two_out[key], one_out[key]) <= 1e-5, key
        manifest = two_js["manifest"]
        assert manifest["engine"]["sp_degree"] == 2
        assert [p["rank"] for p in manifest["peak_memory"]] == [0, 1]  # every rank's peak, gathered by rank 0


def _processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (the bench's ranks inherit it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if marker.encode() in handle.read():
                    found.append(int(pid))
        except OSError:  # gone, or not ours
            continue
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to find the ranks left behind")
def test_sp_timeout_stops_every_rank(tmp_path):
    marker = f"E2E_SP_TEST_{uuid.uuid4().hex}"
    # 0.5 s: the ranks cannot even import torch in that time, so the run is always cut off mid-way
    done, _, _ = _bench(tmp_path, "cut", "--side", "ours", "--sp", "2", "--timeout", "0.5", env={marker: "1"})
    assert done.returncode != 0
    assert "did not finish within --timeout 0.5 s; stopped them all" in done.stderr.strip().splitlines()[-1]
    assert _processes_with(marker) == []
    assert not (tmp_path / "cut.json").exists()


def test_sp_degree_must_divide_the_heads(tmp_path):
    done, _, _ = _bench(tmp_path, "three", "--side", "ours", "--sp", "3")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == ("e2e --sp 3: Sequence-parallel degree 3 does not divide the "
                                                    "model's 4 attention heads; use one of [1, 2, 4].")
