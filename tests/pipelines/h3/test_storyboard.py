"""Storyboards (backend/pipelines/h3/storyboard.py, comfyui_h3/storyboard_job.py) on the tiny model: the plan's
frame counts and durations exact; a continue shot equals the same extension run by hand, a cut shot an independent
generation with its seed; no click where the soundtrack crosses a cut; a Stop keeps the finished shots; the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from comfyui_h3.backend.pipelines.h3.geometry import RequestError
from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest, H3Request
from comfyui_h3.backend.pipelines.h3.storyboard import FADE_S, parse_storyboard, samples_for

SHOTS = {"seed": 40, "width": 64, "height": 64, "steps": 2, "shots": [
    {"prompt": "a lighthouse at dusk, waves", "seconds": 5},
    {"prompt": "the beam sweeps over the sea", "seconds": 1, "transition": "continue"},
    {"prompt": "a harbour at night, gulls", "seconds": 5, "transition": "cut", "seed": 9}]}


def test_the_plan_counts_frames_and_seeds():
    board = parse_storyboard(json.dumps(SHOTS))
    assert [(s.transition, s.frames, s.seed) for s in board.shots] == [("cut", 124, 40), ("continue", 34, 41),
                                                                       ("cut", 124, 9)]
    assert board.total_frames == 282 and board.seconds == 282 / 24
    assert parse_storyboard([{"prompt": "x", "seconds": 6.1}]).shots[0].frames == 158  # 17n + 5 upward


def test_a_yaml_shot_list_reads_as_its_json():
    pytest.importorskip("yaml", reason="YAML shot lists need PyYAML (transformers brings it)")
    text = "seed: 3\nshots:\n  - prompt: a boat\n    seconds: 5\n  - prompt: it sails on\n    seconds: 2\n" \
           "    transition: continue\n"
    board = parse_storyboard(text)
    assert [(s.transition, s.frames, s.seed) for s in board.shots] == [("cut", 124, 3), ("continue", 51, 4)]


@pytest.mark.parametrize("shots,reason", [
    ([{"prompt": "x", "seconds": 5, "transition": "continue"}], "shot 1 cannot continue"),
    ([{"prompt": "x", "seconds": 3}], "shot 1: a cut is a new clip of 5 to 15 s"),
    ([{"prompt": "x"}, {"prompt": "y", "transition": "dissolve"}], "shot 2: transition must be cut or continue"),
    ([{"prompt": " "}], "shot 1: a prompt"),
    ([{"prompt": "x", "colour": 1}], "shot 1: unknown fields colour"),
    ({"shots": [{"prompt": "x"}], "fps": 30}, "Unknown shot-list fields: fps"),
    ({"shots": []}, "one shot at least"),
    ("{not json: [", "neither JSON nor YAML"),
])
def test_bad_shot_lists_are_refused_naming_the_shot(shots, reason):
    with pytest.raises(RequestError, match=reason.replace("(", r"\(")):
        parse_storyboard(shots if isinstance(shots, str) else json.dumps(shots))


class _Recorder:
    """The film's writer, keeping what it is given."""

    def __init__(self, *args):
        self.size, self.frames, self.audio, self.closed = args[1:], [], [], False

    def write_frames(self, frames):
        self.frames.append(frames.clone())

    def write_audio(self, audio):
        self.audio.append(audio.clone())

    def close(self):
        self.closed = True

    def abort(self):
        pass


def _film(tiny_pipeline, tmp_path, should_stop=lambda: False):
    from comfyui_h3.backend.media.encode import reserve_path
    from comfyui_h3.storyboard_job import make_film

    board = parse_storyboard(SHOTS)
    writers, results = [], []

    def run(request):
        results.append(tiny_pipeline.run(request))
        return results[-1]

    def open_writer(*args):
        writers.append(_Recorder(*args))
        return writers[-1]

    out = reserve_path(str(tmp_path / "film.mp4"))
    report = make_film(board, run, out, should_stop=should_stop, open_writer=open_writer)
    return board, report, writers[0] if writers else None, results


def test_continue_and_cut_shots_equal_their_runs_by_hand_and_the_cuts_do_not_click(tiny_pipeline, tmp_path):
    board, report, film, results = _film(tiny_pipeline, tmp_path)
    assert [f.shape[0] for f in film.frames] == [124, 34, 124] and report["frames"] == 282 and film.closed
    rate = results[0].sample_rate
    assert [a.shape[1] for a in film.audio] == [samples_for(n, rate) for n in (124, 34, 124)]
    first = tiny_pipeline.run(H3Request(prompt=SHOTS["shots"][0]["prompt"], num_frames=124, width=64, height=64,
                                        steps=2, seed=40))
    assert torch.equal(film.frames[0], first.frames)
    by_hand = tiny_pipeline.run(H3ExtendRequest(prompts=[SHOTS["shots"][1]["prompt"]], added_frames=34,
                                                source_video_latents=first.video_latents,
                                                source_audio_latents=first.audio_latents, steps=2, seed=41))
    assert torch.equal(film.frames[1], by_hand.frames[-34:])
    cut = tiny_pipeline.run(H3Request(prompt=SHOTS["shots"][2]["prompt"], num_frames=124, width=64, height=64,
                                      steps=2, seed=9))
    assert torch.equal(film.frames[2], cut.frames)
    # the continue joins its scene unfaded (one timeline); the cut fades out and in: no step where they meet
    sound = torch.cat(film.audio, dim=1)
    ramp = int(round(FADE_S * rate))
    assert torch.equal(film.audio[0], first.audio[:, :film.audio[0].shape[1]])  # into a continue: no fade
    continued = by_hand.audio[:, samples_for(124, rate):]  # (the windows' sound may end a few ms short of the
    n = min(continued.shape[1], film.audio[1].shape[1] - ramp)  # frames: the film holds its last sample)
    assert n > film.audio[1].shape[1] - 2 * ramp and torch.equal(film.audio[1][:, :n], continued[:, :n])
    at = samples_for(158, rate)
    assert sound[:, at - 1].abs().max() < 1e-3 and sound[:, at].abs().max() < 1e-3
    inside = torch.cat([film.audio[1][:, :-ramp], film.audio[2][:, ramp:]], dim=1).diff(dim=1).abs().max()
    assert sound[:, at - ramp:at + ramp].diff(dim=1).abs().max() <= inside
    n = min(cut.audio.shape[1], film.audio[2].shape[1])
    assert torch.equal(film.audio[2][:, ramp:n], cut.audio[:, ramp:n])


def test_a_stop_keeps_the_finished_shots_as_a_partial(tiny_pipeline, tmp_path):
    calls = []

    def stop_after_first():
        calls.append(1)
        return len(calls) > 1

    board, report, film, _ = _film(tiny_pipeline, tmp_path, should_stop=stop_after_first)
    assert report["stopped"] and [s["index"] for s in report["shots"]] == [0] and report["frames"] == 124
    assert report["path"].endswith("film_partial_00001.mp4") and not (tmp_path / "film.mp4").exists()


@pytest.mark.slow
def test_cli_storyboard_writes_the_film(tmp_path, tiny_h3_dir):
    from cli_helpers import cli, streams

    shots = tmp_path / "shots.json"
    shots.write_text(json.dumps(SHOTS))
    out = cli("storyboard", shots, "--out", tmp_path / "film.mp4", "--device", "cpu", cwd=tmp_path,
              cache=tiny_h3_dir.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [str(tmp_path / "film.mp4")]
    frames, fps, rate, channels = streams(tmp_path / "film.mp4")
    assert (frames, fps, channels) == (282, 24.0, 2)
    again = cli("storyboard", shots, "--out", tmp_path / "film.mp4", "--device", "cpu", cwd=tmp_path,
                cache=tiny_h3_dir.parent)
    assert again.returncode != 0 and "exists" in again.stderr  # never over a file
