"""User-facing options declared once (backend/options.py, pipelines/<family>/options.py): one rule per option, the
nodes' inputs and the CLI's flags made from the declarations (and unchanged for saved workflows), a new colour-fix
mode and a new H3 sampling option each one declaration."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch

from repo_paths import FIXTURES, REPO
from comfyui_h3.backend.errors import RequestError
from comfyui_h3.backend.options import SEED, Option, OptionTable

FIXTURE = FIXTURES / "node_inputs_de4eda1.json"
# Inputs whose lists are the installation's files (models found on disk): their place and type are compared, not
# the list.
DISCOVERED = {"model", "vae", "student", "transformer", "transformer_ref", "text_encoder", "audio_vae"}
# Inputs whose value kept its meaning for saved workflows but whose tooltip had to say more (a saved workflow stores
# values, never tooltips): the rest of their spec is compared, and the tooltip only has to exist.
REWORDED = {
    # 0 was "off" (whole frames); it is now "auto": whole frames whenever they fit, as before, tiles only where the
    # old 0 ran out of GPU memory.
    ("H3_SeedVR2Upscale", "vae_tile"),
}
# Choice inputs that gained choices at the end (every saved value still means what it meant); their tooltip says
# what the new ones do.
EXTENDED = {
    ("H3_Sample", "schedule"),  # + turbo (the engine's Turbo LoRA grid)
    ("H3_Refine", "schedule"),
    ("H3_LoRA", "lora_name"),  # + the tiny Turbo-named test LoRA, before the folder's files
    ("H3_ModelLoader", "attention"),  # + sage (quantised attention)
    ("H3_SeedVR2Loader", "attention"),
}


# -- the Option rule ------------------------------------------------------------------------------------------------

def test_an_option_has_one_rule_for_type_range_choices_and_its_own():
    batch = Option("batch", "int", 0, "tip", minimum=0, maximum=9, rule=lambda v: None if v % 2 == 0 else
                   f"Batch {v} must be even.")
    assert batch.error(4) is None and batch.error(4.0) is None
    assert batch.error(3) == "Batch 3 must be even."
    assert batch.error(11) == "batch must be in 0..9, got 11."
    assert batch.error(2.5) == "batch must be a whole number, got 2.5."
    assert batch.error(float("nan")) == "batch must be a finite number, got nan."
    assert batch.error(True) == "batch must be a number, got True."
    assert batch.error("4") == "batch must be a number, got '4'."
    mode = Option("mode", "choice", "a", "tip", choices=("a", "b"), message="Mode {value!r} is not {range}.")
    assert mode.error("b") is None and mode.error("c") == "Mode 'c' is not one of a, b."
    flag = Option("flag", "bool", False, "tip")
    assert flag.error(False) is None and flag.error(0) == "flag must be true or false, got 0."
    with pytest.raises(RequestError, match="Batch 5 must be even"):
        batch.check(5)


def test_an_unset_value_passes_and_becomes_none():
    shift = Option("shift", "float", 0.0, "tip", minimum=0.0, maximum=100.0, unset=0.0)
    assert shift.error(0.0) is None and shift.error(None) is None and shift.value(0.0) is None
    assert shift.value(3.5) == 3.5 and shift.error(101.0) == "shift must be in 0..100, got 101."


def test_a_table_labels_its_options_and_checks_request_fields():
    table = OptionTable(Option("overlap", "int", 8, "tip", minimum=0, maximum=64), SEED, label="Node's {name}")
    assert table["overlap"].error(-1) == "Node's overlap must be in 0..64, got -1."

    class Request:
        overlap, seed, other = 70, 0, "not an option"

    with pytest.raises(RequestError, match="Node's overlap must be in 0..64, got 70"):
        table.check_fields(Request())
    Request.overlap = None  # not given: nothing to check
    table.check_fields(Request())


def test_the_cli_flag_is_typed_and_shows_its_range_and_default():
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    Option("overlap", "int", 8, "Frames shared.", minimum=0, maximum=64).add_flag(parser)
    Option("mode", "choice", "a", "The mode.", choices=("a", "b")).add_flag(parser)
    Option("resident", "string", "all", "Blocks.", rule=lambda v: None if v in ("all", "auto") else
           "resident must be all or auto.").add_flag(parser, checked=True)
    text = parser.format_help()
    assert "Frames shared. Range 0..64. (default: 8)" in " ".join(text.split())
    assert parser.parse_args(["--overlap", "70", "--mode", "b"]).overlap == 70  # checked where the request is built
    with pytest.raises(SystemExit):
        parser.parse_args(["--resident", "many"])  # checked: refused as argparse reads it


# -- the nodes' inputs are the declarations, and unchanged for saved workflows --------------------------------------

def _entry(value) -> list:
    if isinstance(value, str):
        return [value, {}]
    kind, *rest = value
    return [kind if isinstance(kind, str) else list(kind), dict(rest[0]) if rest else {}]


def test_every_node_input_is_the_one_saved_workflows_know(monkeypatch, tmp_path):
    """The fixture is every node's INPUT_TYPES at de4eda1, before the declarations (tools/dump_node_inputs.py made
    it): names, order, types, defaults, ranges and tooltips are the same now (a REWORDED tooltip may say more); a
    newer input may only be appended to a node's optional inputs."""
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    monkeypatch.setenv("COMFYUI_H3_MODELS", str(tmp_path))
    before = json.loads(FIXTURE.read_text())
    assert set(before) <= set(NODE_CLASS_MAPPINGS)
    for name, old in before.items():
        now = {group: {k: _entry(v) for k, v in inputs.items()}
               for group, inputs in NODE_CLASS_MAPPINGS[name].INPUT_TYPES().items()}
        for group, inputs in old.items():
            names = list(now.get(group, {}))
            assert names[:len(inputs)] == list(inputs), (name, group)
            assert group == "optional" or len(names) == len(inputs), (name, group, names)
            for key, (kind, spec) in inputs.items():
                got_kind, got_spec = now[group][key]
                if key in DISCOVERED and isinstance(kind, list):
                    assert isinstance(got_kind, list), (name, key)
                    continue
                if (name, key) in REWORDED or (name, key) in EXTENDED:
                    assert got_spec.pop("tooltip") and spec.pop("tooltip"), (name, key)
                if (name, key) in EXTENDED:
                    assert isinstance(got_kind, list) and got_kind[:len(kind)] == kind, (name, key)
                    got_kind = kind
                assert (got_kind, got_spec) == (kind, spec), (name, key)


def test_the_seedvr2_node_lists_its_declared_options_in_order():
    from comfyui_h3.backend.pipelines.seedvr2.options import UPSCALE
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale

    spec = H3SeedVR2Upscale.INPUT_TYPES()
    for group in ("required", "optional"):
        declared = [o.name for o in UPSCALE if o.node == group]
        listed = [k for k in spec[group] if k in UPSCALE]
        assert listed == declared
        assert all(spec[group][n] == UPSCALE[n].input_spec() for n in declared)


def test_the_h3_nodes_share_the_sampling_declarations():
    from comfyui_h3.backend.pipelines.h3.options import SAMPLING
    from comfyui_h3.nodes.edit import H3Edit
    from comfyui_h3.nodes.extend import H3Extend
    from comfyui_h3.nodes.sample import H3Sample

    for node in (H3Sample, H3Edit, H3Extend):
        required = node.INPUT_TYPES()["required"]
        for name in ("steps", "video_shift", "audio_shift", "seed"):
            kind, spec = required[name]
            declared = SAMPLING[name].input_spec()[1]
            assert kind == SAMPLING[name].input_spec()[0]
            assert {k: v for k, v in spec.items() if k != "tooltip"} == \
                {k: v for k, v in declared.items() if k != "tooltip"}, (node.__name__, name)


@pytest.mark.parametrize("command", ["generate", "refine", "edit", "extend", "upscale"])
def test_cli_help_shows_each_declared_option_once_with_its_default_and_range(command):
    from comfyui_h3.backend.pipelines.h3.options import ENGINE, REFINE, SAMPLING, STRENGTH
    from comfyui_h3.backend.pipelines.seedvr2.options import UPSCALE
    from comfyui_h3.cli import _parser

    sub = _parser()._subparsers._group_actions[0].choices[command]
    actions = {flag: action for action in sub._actions for flag in action.option_strings}
    tables = {"upscale": (UPSCALE,), "refine": (SAMPLING, ENGINE, STRENGTH, REFINE)}.get(command, (SAMPLING, ENGINE))
    text = " ".join(sub.format_help().split())
    for option in (o for table in tables for o in table if o.cli_flag):
        flag = option.cli_flag
        assert flag in actions, (command, flag)
        assert text.count(f"{flag} ") + text.count(f"{flag}\n") >= 1
        assert sum(1 for a in sub._actions if flag in a.option_strings) == 1  # once
        rng = option.range_text() if option.kind in ("int", "float") else ""
        help_text = " ".join((actions[flag].help or "").split())
        assert rng in help_text, (command, flag, rng)
        if option.kind == "choice" and actions[flag].choices is not None:
            assert list(actions[flag].choices) == list(option.values)


# -- one place each: a new colour-fix mode, a new H3 sampling option ------------------------------------------------

def test_a_new_colour_fix_mode_is_one_entry(monkeypatch):
    from comfyui_h3.backend.pipelines.seedvr2 import colorfix
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest
    from comfyui_h3.cli import _parser
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale

    def invert(x, ref, match_luminance):  # a test-only mode: the output negated
        return -x

    monkeypatch.setitem(colorfix.METHODS, "invert", invert)  # the one place
    assert "invert" in H3SeedVR2Upscale.INPUT_TYPES()["required"]["color_fix"][0]
    UpscaleRequest(torch.zeros(1, 16, 16, 3, dtype=torch.uint8), color_fix="invert").validate()
    assert _parser().parse_args(["upscale", "--video", "v.mp4", "--out", "o.mp4", "--color-fix", "invert"]) \
        .color_fix == "invert"
    x = torch.rand(3, 2, 8, 8) * 2 - 1
    assert torch.equal(colorfix.color_fix(x, x.clone(), "invert"), -x)
    with pytest.raises(RequestError, match="Colour fix 'sepia' is not one of wavelet, adain, lab, none, invert"):
        UpscaleRequest(torch.zeros(1, 16, 16, 3, dtype=torch.uint8), color_fix="sepia").validate()


def test_a_new_h3_sampling_option_is_one_declaration(monkeypatch):
    """Declared once (here: the request's live-preview interval as a sampling option, a field H3Request already
    has), it becomes an optional input of the three H3 nodes and a flag of generate / edit / extend, reaches the
    request from both, and its rule refuses a bad value at the request."""
    from comfyui_h3.backend.pipelines.h3 import options
    from comfyui_h3.backend.pipelines.h3.request import H3Request
    from comfyui_h3.cli import _parser
    from comfyui_h3.cli_generate import build_request
    from comfyui_h3.nodes import sample
    from comfyui_h3.nodes.edit import H3Edit
    from comfyui_h3.nodes.extend import H3Extend

    every = Option("preview_every", "int", 0, "Previews every N steps.", minimum=0, maximum=50, node="optional")
    monkeypatch.setattr(options, "SAMPLING", options.SAMPLING.adding(every))  # the one place
    for node in (sample.H3Sample, H3Edit, H3Extend):
        assert node.INPUT_TYPES()["optional"]["preview_every"] == every.input_spec()
    args = _parser().parse_args(["generate", "--prompt", "x", "--preview-every", "3"])
    assert build_request(args).preview_every == 3
    for command in (["edit", "--video", "v.mp4", "--mask", "m.png", "--out", "o.mp4"],
                    ["extend", "--video", "v.mp4", "--seconds", "5", "--out", "o.mp4"]):
        assert _parser().parse_args(command + ["--prompt", "x", "--preview-every", "2"]).preview_every == 2

    seen = []
    monkeypatch.setattr(sample, "run_engine", lambda handle, request, *a, **k: seen.append(request) or _stop())
    with pytest.raises(_Stop):
        sample.H3Sample().sample(None, "a prompt", 5.0, 0, 0, 4, 0.0, 0.0, 0, preview_every=2)
    assert seen[0].preview_every == 2
    with pytest.raises(RequestError, match="preview_every must be in 0..50, got 60"):
        H3Request(prompt="x", preview_every=60).validate()


class _Stop(Exception):
    pass


def _stop():
    raise _Stop


def test_batch_frames_one_is_refused_at_the_node_with_the_reason():
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale

    verdict = H3SeedVR2Upscale.VALIDATE_INPUTS(1)
    assert isinstance(verdict, str) and "use 0 for auto or 5" in verdict
    assert "1," not in H3SeedVR2Upscale.INPUT_TYPES()["required"]["batch_frames"][1]["tooltip"].split("(")[1]


def test_no_generic_module_names_a_family_policy():
    """WeightPolicy carries only the shared storage / placement / resident blocks (H3 and SeedVR2 stream blocks
    alike); H3's own policy, the AdaLN cache, lives in its family."""
    import dataclasses

    from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy
    from comfyui_h3.backend.runtime import WeightPolicy

    assert [f.name for f in dataclasses.fields(WeightPolicy)] == ["storage", "placement", "resident_blocks"]
    assert {f.name for f in dataclasses.fields(H3WeightPolicy)} - {"storage", "placement", "resident_blocks"} == \
        {"adaln"}
    root = REPO / "backend"
    for generic in ("runtime.py", "engine_config.py", "engine.py", "options.py", "errors.py", "finite.py"):
        text = (root / generic).read_text()
        assert "adaln" not in text.lower(), generic
    assert not os.path.exists(root / "pipelines" / "h3" / "finite.py")
