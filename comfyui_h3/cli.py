"""Command line: `python -m comfyui_h3 {generate,refine,edit,extend,upscale,run,demo,make-tiny} ...` (see --help of each)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEMO_WORKFLOWS = ("h3_text_to_video", "h3_first_last_frame", "h3_object_removal", "h3_object_replacement",
                  "h3_object_removal_clicks", "h3_object_removal_text", "h3_object_replacement_clicks",
                  "h3_object_replacement_text", "h3_inpainting", "h3_extension", "h3_generate_then_extend",
                  "seedvr2_upscale_video", "h3_generate_then_upscale", "h3_extend_then_upscale",
                  "h3_video_restyle", "h3_generate_then_refine", "h3_refine_vs_upscale", "h3_storyboard")
STEPPED_NODES = ("H3_Sample", "H3_Edit", "H3_Extend", "H3_Refine", "H3_Storyboard")  # the demo's --steps sets theirs
DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, unless there is none to show (None, off, an empty list) or the help text
    already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if default is None or default is False or default is argparse.SUPPRESS or default == [] \
                or "default" in text.lower():
            return text
        return super()._get_help_string(action)


def _device_arg(text: str) -> str:
    import re

    if not re.fullmatch(DEVICE_PATTERN, text):
        raise argparse.ArgumentTypeError(f"{text!r} is not auto, cpu, cuda or cuda:N")
    return text


def _count_arg(text: str) -> int:
    """A count of things to add (extend's --windows): a whole number >= 1 (0 would add nothing)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def resolve_device(name: str) -> str:
    """--device -> the engine's device: auto is CUDA when a GPU is visible, else the CPU."""
    if name == "cpu":
        return name
    import torch

    if torch.cuda.is_available():
        return "cuda" if name == "auto" else name
    if name == "auto":
        return "cpu"
    raise ValueError(f"--device {name}: no CUDA GPU is visible to this process; use --device auto or cpu.")


def _model_option(p) -> None:
    p.add_argument("--model", default="tiny",
                   help="MiniMax-H3 diffusers folder, 'tiny' (built-in, makes noise), or 'release': no folder, the "
                        "single-file options below with the release's configs (needs --tokenizer).")
    p.add_argument("--transformer", default=None, metavar="FILE",
                   help="ComfyUI's native single-file DiT for text / keyframes to video and edit (e.g. "
                        "minimax_h3_fl2va_bf16.safetensors; bf16, or FP8 scaled or not), instead of the folder's "
                        "transformer/.")
    p.add_argument("--transformer-ref", default=None, metavar="FILE",
                   help="The native DiT for references and extend (minimax_h3_ref2va_*.safetensors), instead of "
                        "transformer_ref/.")
    p.add_argument("--text-encoder", default=None, metavar="FILE",
                   help="The native text encoder file (qwen3vl_32b_minimax_h3_bf16.safetensors), instead of "
                        "text_encoder/.")
    p.add_argument("--vae", default=None, metavar="FILE",
                   help="The native video VAE file (minimax_h3_video_vae_*.safetensors), instead of vae/.")
    p.add_argument("--audio-vae", default=None, metavar="FILE",
                   help="The native audio VAE file (minimax_h3_audio_vae_*.safetensors), instead of audio_vae/.")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="With --model release: a Qwen tokenizer folder (vocab.json, merges.txt, "
                        "tokenizer_config.json), e.g. ComfyUI/comfy/text_encoders/qwen25_tokenizer.")
    from .backend.pipelines.h3.options import ENGINE

    ENGINE.add_flags(p, "adaln_cache")
    ENGINE["resident_blocks"].add_flag(p, checked=True, metavar="all|auto|N")  # refused before any input is read
    ENGINE["attention"].add_flag(p, choices=None)  # any registered name: its rule runs when the config is built
    ENGINE.add_flags(p, "vsa_topk", "vsa_dense_steps", "attention_precision", vsa_topk=None, vsa_dense_steps=None,
                     attention_precision=None)  # None: not given
    p.add_argument("--fasth3", default=None, metavar="FILE|tiny",
                   help="FastH3, FastVideo's 4-step student: its adapter_model.safetensors (vsa-datafree: needs "
                        "--attention vsa; or dense-datafree), fused into transformer/ at load; 'tiny': the built-in "
                        "test student for the tiny model. generate then samples text-to-video on its 4-step "
                        "schedule.")
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="A LoRA (.safetensors: diffusers / PEFT, kohya or ComfyUI-native keys) merged into the DiT "
                        "at load, at STRENGTH (default 1); repeat to stack several, in order. 'tiny' / "
                        "'tiny-turbo': the built-in test LoRAs for the tiny model (the second named as a 4-step "
                        "Turbo file).")
    p.add_argument("--fp8", action="store_true",  # the weights option's fp8 (bf16 without the flag)
                   help="Hold the DiT blocks' matmul weights in FP8 (e4m3, per-channel scales; ~19 GB less for the "
                        "release) and run FP8 matmuls with per-row activation scales. Needs an NVIDIA GPU with FP8 "
                        "(compute capability 8.9+: RTX 40xx, L4/L40, H100/H200 or newer) and bfloat16.")


def _sampling_options(p, steps_help: str = "") -> None:
    from .backend.pipelines.h3.options import SAMPLING

    SAMPLING["steps"].add_flag(p, help=steps_help or None)
    SAMPLING["seed"].add_flag(p, help="Same seed and inputs -> the same result.")
    # the shifts (None: the folder's) and any sampling option declared after them
    SAMPLING.add_flags(p, exclude=("steps", "seed"), video_shift=None, audio_shift=None)


def _device_options(p) -> None:
    p.add_argument("--device", default="auto", type=_device_arg,
                   help="auto (the first CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N.")
    from .backend.pipelines.h3.options import ENGINE

    ENGINE["dtype"].add_flag(p, default=None)


def _latents_option(p, what: str = "the final latents") -> None:
    p.add_argument("--save-latents", default=None, metavar="FILE.safetensors",
                   help=f"Also write {what}: video [1,24,T,h,w], audio [2,32,Ta] float32.")


def _generation_options(p, steps_help: str, latents_what: str = "the final latents") -> None:
    """generate's and refine's sampling, schedule, device and output flags."""
    from .cli_manifest import add_manifest_option

    _sampling_options(p, steps_help)
    p.set_defaults(steps=None)
    p.add_argument("--schedule", default="auto", choices=["auto", "default", "fasth3", "turbo"],
                   help="default: --steps steps on the shifted schedule; fasth3: the FastH3 student's 4-step ladder; "
                        "turbo: the grid of the --lora Turbo file (LightX2V's; its steps and shifts); auto: fasth3 "
                        "with --fasth3, turbo with a Turbo --lora, else default.")
    _device_options(p)
    add_manifest_option(p)
    p.add_argument("--out", default=None, help="Output MP4 (never overwritten). Default: output/h3_NNNNN.mp4")
    _latents_option(p, latents_what)


def _parser() -> argparse.ArgumentParser:
    from .backend.pipelines.seedvr2 import options as seedvr2_options
    from .cli_manifest import add_manifest_option
    from .nodes.widgets import GPUS_INPUT

    p = argparse.ArgumentParser(prog="python -m comfyui_h3", description="MiniMax-H3 video+audio from the shell.",
                                formatter_class=_HelpFormatter)
    commands = p.add_subparsers(dest="command", required=True)

    def command(name: str, **kwargs):
        return commands.add_parser(name, formatter_class=_HelpFormatter, **kwargs)

    t = command("make-tiny", help="Build the tiny MiniMax-H3 test model set (noise-like output).")
    t.add_argument("--out", required=True, help="Folder to create.")
    t.add_argument("--overwrite", action="store_true", help="Replace the folder when it is not empty.")

    g = command("generate", help="Generate one video (+ audio) from a prompt.")
    _model_option(g)
    g.add_argument("--prompt", required=True, help="What happens, and what it sounds like.")
    g.add_argument("--first-frame", help="Image the video starts on (fl2va).")
    g.add_argument("--last-frame", help="Image the video ends on (fl2va).")
    g.add_argument("--reference", action="append", default=[], metavar="FILE",
                   help="Reference image / video / audio file (ref2va), repeatable; order matters.")
    length = g.add_mutually_exclusive_group()
    length.add_argument("--seconds", type=float,
                        help="Duration, 5 to 15 s at 24 fps (default 5): the frame count snaps up to 17n+5 (5 s = "
                             "124 frames); above 14.375 s the longest valid clip (345 frames) is made.")
    length.add_argument("--frames", type=int, help="Frame count instead of --seconds, the same rule (snapped up to "
                                                   "17n+5; 346..360 frames give 345).")
    g.add_argument("--width", type=int, help="Multiple of 32, with --height. Default: the first frame's aspect, else "
                                             "16:9 at 768 short edge.")
    g.add_argument("--height", type=int, help="Multiple of 32, with --width.")
    _generation_options(g, "Denoising steps (model evaluations). Default: 50, or 4 with the fasth3 schedule.")
    g.add_argument("--no-decode", action="store_true", help="Latents only (with --save-latents).")

    f = command("refine", help="Refine a clip to a larger size (1080p): its latents upscaled and denoised again by "
                               "H3 (the latent route beside SeedVR2's upscale).")
    _model_option(f)
    source = f.add_mutually_exclusive_group(required=True)
    source.add_argument("--latents", metavar="FILE.safetensors",
                        help="The clip's latents (generate --save-latents): upscaled in latent space (bilinear).")
    source.add_argument("--video", help="A video file instead: resized in pixels (Lanczos) onto --size, encoded there.")
    f.add_argument("--prompt", required=True, help="The clip's prompt (the second pass is conditioned on it).")
    from .backend.pipelines.h3.options import REFINE, STRENGTH

    target = f.add_mutually_exclusive_group()
    REFINE["short_side"].add_flag(target, default=None)
    REFINE["scale"].add_flag(target, default=None)
    target.add_argument("--size", default=None, metavar="WxH",
                        help="Target width x height instead, multiples of 32, at least the source's. Default (none "
                             "of the three): short side 1088, i.e. 1080p on H3's grid.")
    from .backend.pipelines.h3.refine import REFINE_AUDIO, REFINE_DENOISE

    STRENGTH["denoise"].add_flag(f, default=REFINE_DENOISE, checked=True)
    STRENGTH["source_audio"].add_flag(f, default=REFINE_AUDIO)
    _generation_options(f, "Steps of the full schedule; the pass runs the last --denoise of them. Default: 50, or "
                           "4 with the fasth3 schedule.", "the refined latents")

    e = command("edit", help="Remove / replace / inpaint what a mask covers in a video (keeps the rest).")
    _model_option(e)
    e.add_argument("--video", required=True, help="Source video (5-15 s are used; 24 fps, 17n+5 frames, /32 size).")
    e.add_argument("--mask", required=True,
                   help="PNG/image (all frames), video (luma, one frame per frame) or .npz with array 'mask'; "
                        "white/1 = regenerate, black/0 = keep.")
    e.add_argument("--mode", default="removal", choices=["removal", "replace", "inpaint"],
                   help="Preset: mask growth / feather / audio defaults.")
    e.add_argument("--prompt", required=True, help="The whole edited video, as you want it.")
    _sampling_options(e)
    e.add_argument("--audio-mode", default=None, choices=["keep", "regenerate", "blend"],
                   help="Default: the preset's.")
    e.add_argument("--audio-level", type=float, default=None, help="Blend level 0 (keep) .. 1 (regenerate).")
    e.add_argument("--mask-grow", type=int, default=None, help="Pixels (0..512); default (or -1): the preset's.")
    e.add_argument("--mask-feather", type=int, default=None, help="Pixels (0..512); default (or -1): the preset's.")
    from .backend.pipelines.h3.options import STRENGTH

    STRENGTH["denoise"].add_flag(e, checked=True, help="Below 1: the masked region re-made from the source itself at "
                                                       "this strength (1: from noise).")
    _device_options(e)
    add_manifest_option(e)
    e.add_argument("--out", required=True, help="Output MP4 (never overwritten).")
    _latents_option(e)

    x = command("extend", help="Continue a video past 15 s, window by window, with its sound.")
    _model_option(x)
    x.add_argument("--video", required=True, help="The video to continue (cut down to 17n+5 frames at 24 fps).")
    amount = x.add_mutually_exclusive_group(required=True)
    amount.add_argument("--seconds", type=float, help="Seconds to add (rounded up to whole 17-frame chunks).")
    amount.add_argument("--windows", type=_count_arg, help="Add this many full windows instead (at least 1).")
    x.add_argument("--prompt", action="append", required=True,
                   help="What happens next; once for all windows, or repeated once per window.")
    x.add_argument("--window-seconds", type=float, default=None,
                   help="Window length in seconds (snapped to 17n+5 frames, at most 14.375 s); default 277 frames.")
    x.add_argument("--window-frames", type=int, default=277, help="Window length in frames, 17n+5.")
    x.add_argument("--overlap-frames", type=int, default=22, help="Guide frames per window, 17n+5.")
    x.add_argument("--audio-mode", default="continue", choices=["continue", "lock"],
                   help="continue: generate the soundtrack on; lock: keep the driving (or the source's) audio.")
    x.add_argument("--driving-audio", default=None, help="Audio file for --audio-mode lock (from the source's start).")
    _sampling_options(x, "Denoising steps per window.")
    x.add_argument("--crf", type=int, default=18, help="H.264 quality of the output (lower is better).")
    _device_options(x)
    add_manifest_option(x)
    x.add_argument("--out", required=True, help="Output MP4 (never overwritten).")
    _latents_option(x, "the latents of the whole result")

    u = command("upscale", help="Upscale / restore a video with SeedVR2 (one diffusion step per batch of frames).")
    u.add_argument("--model", default="tiny",
                   help="SeedVR2 DiT .safetensors (3B or 7B, fp16 or fp8): a path, a name under models/SEEDVR2 or "
                        "COMFYUI_H3_MODELS, or 'tiny' (built-in, makes noise).")
    u.add_argument("--vae", default="auto",
                   help="SeedVR2 VAE .safetensors (ema_vae_fp16); auto: the one beside the DiT, else the first found.")
    u.add_argument("--variant", default="auto", choices=["auto", "3b", "7b"],
                   help="Refuse a DiT file of the other model; auto: what the file holds.")
    u.add_argument("--video", required=True, help="The video to upscale (its sound is kept unchanged).")
    upscale_options = seedvr2_options.UPSCALE
    size = u.add_mutually_exclusive_group()
    upscale_options["scale"].add_flag(size, default=None)
    upscale_options["short_side"].add_flag(size, default=None, help="Output short side in pixels (aspect kept).")
    size.add_argument("--size", default=None, metavar="WxH", help="Output width x height, e.g. 1920x1080.")
    upscale_options.add_flags(u, exclude=("scale", "short_side"))  # every other SeedVR2 option with a flag
    _device_options(u)
    u.add_argument("--sp-degree", type=int, default=1, help="Window-parallel ranks (one GPU each).")
    u.add_argument("--gpus", default="", metavar="IDS|all", help=GPUS_INPUT["gpus"][1]["tooltip"])
    u.add_argument("--attention", default="sdpa", help="Attention backend (see the loader node's list); sage's "
                   "settings after a colon, e.g. sage:scales=row.")
    seedvr2_options.ENGINE["resident_blocks"].add_flag(u, checked=True, metavar="all|auto|N")
    u.add_argument("--fp8", action="store_true",  # the weights option's fp8 (bf16 without the flag)
                   help="Hold the DiT blocks' matmul weights in FP8 (e4m3, per-channel scales; an fp8 file's as they "
                        "are) and run FP8 matmuls with per-row activation scales. Needs an NVIDIA GPU with FP8 "
                        "(compute capability 8.9+: RTX 40xx, L4/L40, H100/H200 or newer) and bfloat16.")
    u.add_argument("--crf", type=int, default=18, help="H.264 quality of the output (lower is better).")
    add_manifest_option(u)
    u.add_argument("--out", required=True, help="Output MP4 (never overwritten).")

    r = command("run", help="Run an API-format workflow (.api.json) of this pack's nodes.",
                description="Run an API-format workflow. Files the loaders name are read from $COMFYUI_H3_INPUT "
                            "(default ./input); the pack's sample inputs, which the shipped workflows name, are used "
                            "from the pack when they are not there. Outputs go to --out-dir ($COMFYUI_H3_OUTPUT, "
                            "default ./output); temporaries (previews, streamed results) go to a hidden folder in it, "
                            "removed at the end, unless $COMFYUI_H3_TEMP names a folder to keep them in.")
    r.add_argument("workflow", help="The workflow file, API format (.api.json); checked as ComfyUI checks a prompt "
                                    "before anything runs.")
    r.add_argument("--set", action="append", default=[], metavar="NODE_ID.INPUT=VALUE",
                   help="Override an input (VALUE parsed as JSON if it is JSON), repeatable.")
    r.add_argument("--server", help="Submit to a running ComfyUI at this URL instead (POST /prompt).")
    r.add_argument("--out-dir", default=None, help="Where outputs go (default: ComfyUI's or ./output).")
    r.add_argument("--timeout", type=float, default=6 * 3600,
                   help="With --server: seconds to wait for the workflow.")

    s = command("storyboard", help="Make a film from a shot list (cuts and continued scenes, one soundtrack).",
                description="A shot list (JSON or YAML: {\"shots\": [{\"prompt\", \"seconds\", \"transition\": "
                            "cut|continue, \"seed\"}], \"seed\", \"width\", \"height\", \"steps\", "
                            "\"reference_images\"}; docs/STORYBOARD.md) made into one MP4: a cut is a new "
                            "generation (with the film's reference images), a continue extends the scene so far.")
    _model_option(s)
    s.add_argument("shots", help="The shot list file (.json / .yaml); reference images relative to its folder.")
    s.add_argument("--out", required=True, help="The film (MP4, never overwritten).")
    _device_options(s)

    m = command("mcp", help="Serve the pack's jobs to agents over the Model Context Protocol (pip install "
                            "\"comfyui-h3[mcp]\").",
                description="An MCP server whose tools are the pack's jobs (generate, edit, extend, upscale, "
                            "run_workflow, upload_file, list_inputs, read_output), over stdio (the default: an agent "
                            "starts it) or streamable HTTP on 127.0.0.1. Without --server the jobs run in this "
                            "process on the pack's nodes (folders as for `run`); with --server on that ComfyUI, "
                            "through its own routes.")
    m.add_argument("--server", default=None, help="A running ComfyUI to run the jobs on (e.g. http://127.0.0.1:8188).")
    m.add_argument("--http", type=int, default=None, metavar="PORT",
                   help="Serve streamable HTTP on 127.0.0.1:PORT (path /mcp) instead of stdio.")

    d = command("demo", help="Build the tiny model if needed and run the shipped workflows on it.")
    d.add_argument("--out-dir", default=None, help="Default: ./output")
    d.add_argument("--steps", type=int, default=None, help="Override the workflows' step count.")
    return p


# multiprocessing's resource tracker (a helper process, started with the first worker) reports at exit the
# semaphores a stopped run's workers left it to remove, after removing them: after Ctrl-C that is a page of warnings
# about nothing a user can act on. The filter reaches the tracker through the interpreter flags it is started with.
_TRACKER_QUIET = "ignore::UserWarning:multiprocessing.resource_tracker"


def main(argv: list[str] | None = None) -> int:
    if _TRACKER_QUIET not in sys.warnoptions:
        sys.warnoptions.append(_TRACKER_QUIET)
    args = _parser().parse_args(argv)
    _show_worker_reports(bool(os.environ.get("COMFYUI_H3_DEBUG")))
    from .cli_signals import stop_signals

    with stop_signals() as stop:  # Ctrl-C / SIGTERM: a Stop, then quit (cli_signals.py); exit 128 + the signal
        stopped = 130 if stop is None else None  # main() off the main thread: the host's Ctrl-C
        try:
            code = {"make-tiny": _make_tiny, "generate": _generate, "refine": _refine, "edit": _edit, "extend": _extend,
                    "upscale": _upscale, "run": _run, "demo": _demo, "mcp": _mcp,
                    "storyboard": _storyboard}[args.command](args)
            return stop.exit_code if code == 130 and stop is not None and stop.requested else code  # a SIGTERM: 143
        except KeyboardInterrupt:
            print("Stopped.", file=sys.stderr)
            return stopped or stop.exit_code
        except Exception as exc:
            # a node stopped by Ctrl-C (run / demo): its message says what was kept; a failure that a Stop caused
            # (a worker killed by it) is the Stop too
            if type(exc).__name__ == "H3Interrupted" or (stop is not None and stop.requested and _user_facing(exc)):
                print(str(exc) if str(exc).startswith("Stopped") else "Stopped.", file=sys.stderr)
                return stopped or stop.exit_code
            if not _user_facing(exc):
                raise  # a bug: its traceback is the report
            if os.environ.get("COMFYUI_H3_DEBUG"):
                import traceback

                traceback.print_exc()
            print(f"error: {error_line(exc)}", file=sys.stderr)
            return 2
        finally:
            if args.command in ("run", "demo"):  # the workflows' engines end with the command (main() may be called
                _end_engines()  # in-process, by a host or a test: no worker outlives it)


def _end_engines() -> None:
    engine = sys.modules.get(f"{__package__}.backend.engine")
    if engine is not None:  # never imported: no engine was started, and importing it would pull in torch
        engine.shutdown_all()


def _show_worker_reports(show: bool) -> None:
    """The engine logs a failed worker's whole report (its traceback) to `comfyui_h3.worker` and raises its cause on
    one line: the terminal shows the report only with COMFYUI_H3_DEBUG=1."""
    import logging

    logger = logging.getLogger("comfyui_h3.worker")
    for handler in [h for h in logger.handlers if getattr(h, "comfyui_h3_cli", False)]:
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr) if show else logging.NullHandler()
    handler.comfyui_h3_cli = True
    logger.addHandler(handler)
    logger.propagate = False


def _user_facing(exc: BaseException) -> bool:
    """Errors a user can act on (bad input, files, disks, checkpoints, the workers' reports): one line, exit 2."""
    return isinstance(exc, (ValueError, OSError, RuntimeError)) or type(exc).__name__ == "SafetensorError"


def error_line(exc: BaseException) -> str:
    """One line for the terminal: an OSError as "<file>: <reason>", anything else its message with its lines joined
    (a server's list of node errors stays whole) and a worker's traceback left out (shown with COMFYUI_H3_DEBUG=1)."""
    import errno

    if isinstance(exc, OSError) and exc.strerror and type(exc).__str__ is OSError.__str__:
        where = f"{exc.filename}: " if exc.filename else ""
        hint = " (free some space, or write somewhere else)" if exc.errno == errno.ENOSPC else ""
        return f"{where}{exc.strerror}{hint}"
    text, _, trace = str(exc).partition("Traceback (most recent call last):")
    if type(exc).__name__ == "SafetensorError":
        text = f"safetensors: {text}"
    line = "; ".join(part.strip() for part in text.splitlines() if part.strip()) or type(exc).__name__
    return line + (" (the traceback: run again with COMFYUI_H3_DEBUG=1)" if trace else "")


def _make_tiny(args) -> int:
    from .backend.models.tiny import make_tiny_h3

    out = Path(args.out).expanduser()
    if not args.overwrite and out.is_dir() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; add --overwrite to replace it, or choose another --out.")
    print(make_tiny_h3(out, overwrite=args.overwrite))
    return 0


def _model_folder(args) -> str:
    """--model as a folder: 'release' (the release's configs, for single files; with --tokenizer), or as
    _resolve_model."""
    if args.model == "release":
        from .native_setup import release_model_dir

        return release_model_dir(getattr(args, "tokenizer", None))
    return _resolve_model(args.model)


def _resolve_model(name: str) -> str:
    if name == "tiny":
        from .tiny_model import ensure_tiny_model

        return str(ensure_tiny_model())
    from .comfy_services import resolve_h3_model

    return resolve_h3_model(name, allow_explicit_path=True)


# generate / edit / extend get the model as a callable: outputs and inputs are checked first, the model folder (the
# tiny set may need building) only then.
def _generate(args) -> int:
    from .cli_generate import generate

    args.device = resolve_device(args.device)
    return generate(args, lambda: _model_folder(args))


def _refine(args) -> int:
    from .cli_refine import refine

    args.device = resolve_device(args.device)
    return refine(args, lambda: _model_folder(args))


def _edit(args) -> int:
    from .cli_edit import edit

    args.device = resolve_device(args.device)
    return edit(args, lambda: _model_folder(args))


def _extend(args) -> int:
    from .backend.pipelines.h3.geometry import frames_for_seconds
    from .cli_extend import extend

    args.device = resolve_device(args.device)
    if args.window_seconds is not None:
        args.window_frames = frames_for_seconds(args.window_seconds)
    return extend(args, lambda: _model_folder(args))


def _upscale(args) -> int:
    from .backend.engine_config import resolve_devices
    from .cli_upscale import upscale
    from .nodes.seedvr2_loader import resolve_seedvr2_files

    # --gpus by the loader node's rule, before the input is read
    args.device, args.sp_degree = resolve_devices(resolve_device(args.device), args.sp_degree, args.gpus)
    return upscale(args, lambda: resolve_seedvr2_files(args.model, args.vae, allow_explicit_path=True))


def _run(args) -> int:
    from .registration import NODE_CLASS_MAPPINGS
    from .workflow_runner import apply_overrides, load_workflow

    prompt = apply_overrides(load_workflow(args.workflow), args.set, NODE_CLASS_MAPPINGS)
    if args.server:
        from .cli_outputs import check_writable
        from .server_client import run_on_server

        check_writable(os.path.join(args.out_dir or "output", "probe"))  # where the results are downloaded to
        files = run_on_server(args.server, prompt, args.out_dir or "output", timeout_s=args.timeout)
    else:
        files = _run_local(prompt, args.out_dir)
    for path in files:
        print(path)
    return 0


def _run_local(prompt: dict, out_dir: str | None) -> list[str]:
    from . import comfy_services as services
    from .cli_outputs import check_writable
    from .cli_signals import stop_requested
    from .headless_temp import temp_folder
    from .workflow_runner import execute

    if out_dir:
        os.environ["COMFYUI_H3_OUTPUT"] = os.path.abspath(out_dir)
    check_writable(os.path.join(services.output_directory(), "H3", "probe"))  # before the workflow, not after it
    with temp_folder(services.output_directory()):
        outputs = execute(prompt, on_node=lambda nid, cls: print(f"[{nid}] {cls}", file=sys.stderr),
                          should_stop=stop_requested)  # a node that finished despite a Stop: no node after it runs
    root = services.output_directory()
    return [os.path.join(root, item.get("subfolder", ""), item["filename"])
            for ui in outputs.values() for item in ui.get("images", []) if item.get("type", "output") == "output"]


def _storyboard(args) -> int:
    from .cli_storyboard import storyboard

    args.device = resolve_device(args.device)
    return storyboard(args, lambda: _model_folder(args))


def _mcp(args) -> int:
    try:
        from .agent.mcp_server import serve
    except ImportError as exc:
        print(f"The MCP server needs the mcp package ({exc}): pip install \"comfyui-h3[mcp]\"", file=sys.stderr)
        return 2
    serve(args.server, args.http)
    return 0


def _demo(args) -> int:
    from . import comfy_services as services
    from .headless_temp import TEMP_ENV
    from .templates import workflows_dir
    from .tiny_model import ensure_tiny_model
    from .workflow_runner import apply_overrides, load_workflow

    out_dir = os.path.abspath(args.out_dir or "output")
    os.environ["COMFYUI_H3_OUTPUT"] = out_dir
    os.environ.setdefault("COMFYUI_H3_INPUT", os.path.join(out_dir, "demo_inputs"))
    os.environ.setdefault(TEMP_ENV, os.path.join(out_dir, "previews"))  # Mask Preview's MP4s
    print(f"tiny model: {ensure_tiny_model()}  (random weights: the videos are noise-like by design)")
    _write_demo_inputs(services.input_directory())
    made = []
    for name in DEMO_WORKFLOWS:
        prompt = load_workflow(workflows_dir() / f"{name}.api.json")
        if args.steps is not None:  # 0 is refused by the nodes' rule, not taken for "unset"
            prompt = apply_overrides(prompt, [f"{nid}.steps={args.steps}" for nid, n in prompt.items()
                                              if n["class_type"] in STEPPED_NODES])
        print(f"== {name}", file=sys.stderr)
        made += _run_local(prompt, out_dir)
    for path in made:
        print(path)
    return 0


def _write_demo_inputs(folder: str) -> None:
    """The inputs the shipped workflows name (the pack's sample inputs), copied in where missing."""
    from .install_samples import install_sample_inputs

    install_sample_inputs(folder)
