"""MiniMax-H3's user-facing options, each declared once (backend/options.py): the H3 nodes' inputs and the generate /
edit / extend flags are made from these, and the requests check their fields with these rules; family.engine_config
is the one place an engine config is built from the ENGINE choices (H3 Model Loader and the CLI alike). A new option
is one Option here, and its field where its stage reads it."""

from __future__ import annotations

from ...attention.registry import AttentionSpec, available as attention_backends
from ...attention.vsa_plan import PRECISIONS
from ...engine_config import DTYPES
from ...options import SEED, Option, OptionTable, resident_blocks_option
from . import step_cache

MAX_STEPS = 1000  # the one bound on denoising steps: the nodes' widgets, generate / edit / extend and demo --steps
WEIGHT_FORMATS = {"bf16": "compute", "fp8": "fp8"}  # the 'weights' option -> WeightPolicy.storage
RELEASE_BLOCKS = 50  # the released DiT's blocks: the resident_blocks choices go up to it
RESIDENT_BLOCKS_HELP = ("DiT blocks kept on the GPU. all (default): every weight stays on the GPU, the fastest when "
                        "the model fits. auto: as many as fit beside this request's activations; the others are "
                        "copied in from pinned host memory while earlier blocks compute (about as fast), and the "
                        "text encoder and VAEs leave the GPU while the DiT runs when memory is short. A number: keep "
                        "that many (0 streams every block). Every choice but all holds the DiT blocks in host RAM "
                        "(~64 GB for the released model, ~45 GB with fp8 weights).")


def _shift(name: str, folder: str, release: int) -> Option:
    return Option(name, "float", 0.0, minimum=0.0, maximum=100.0, step=0.1, unset=0.0,
                  message="{label} must be positive, at most {maximum:g} (or unset: the model folder's), got {value}.",
                  tooltip=f"Flow-match sigma shift of the {name.split('_')[0]} schedule; 0 = the model folder's "
                          f"({folder}/scheduler_config.json: {release} for the release).",
                  help=f"{name.split('_')[0].capitalize()} schedule shift. Default: the model folder's "
                       f"({folder}/scheduler_config.json; {release} for the release).")


def _vsa_setting(name: str, default: float, minimum: float, maximum: float, step: float, what: str,
                 cli_what: str) -> Option:
    return Option(name, "float", default, minimum=minimum, maximum=maximum, step=step, stage="engine",
                  tooltip=f"With attention vsa: {what} Ignored by the other attention kernels.",
                  help=f"With --attention vsa: {cli_what}")


# What every H3 task's request carries (H3 Sample / Edit / Extend, generate / edit / extend)
SAMPLING = OptionTable(
    Option("steps", "int", 50, "Denoising steps (one model evaluation each; no CFG).", minimum=1, maximum=MAX_STEPS,
           message="{label} must be between {minimum} and {maximum}, got {value}.",
           help="Denoising steps (model evaluations)."),
    _shift("video_shift", "scheduler", 12),
    _shift("audio_shift", "audio_scheduler", 3),
    SEED.with_(tooltip="Same seed, same inputs -> same result.", message="{label} must be in [0, 2^64), got {value}."),
    Option("step_cache", "string", "off", choices=step_cache.CHOICES, rule=step_cache.rule, node="optional", tooltip=(
        "Skip DiT forwards whose result barely changes (DBCache-style: the first blocks always run; when their "
        "residual moved less than a threshold since the last full step, the rest is reused, TaylorSeer-"
        "extrapolated). off: every forward (exact). quality / balanced / fast: fewer forwards, a small change of "
        "the result. Provisional presets: tuned on random weights."),
           help="Step caching: off (every forward, exact), quality, balanced, fast, a threshold (e.g. 0.1) or every:K "
                "(compute every K-th step). Lossy; the manifest counts the forwards computed."),
)

# A start from existing latents or a clip at a strength (strength.py): H3 Sample's and H3 Refine's, generate's and
# refine's
def _strength_rule(value) -> str | None:
    return None if value > 0 else f"denoise must be a strength above 0 and at most 1 (1 = from noise), got {value!r}."


STRENGTH_MESSAGE = "{label} must be a strength above 0 and at most 1 (1 = from noise), got {value!r}."
STRENGTH = OptionTable(
    Option("denoise", "float", 1.0, minimum=0.0, maximum=1.0, step=0.01, rule=_strength_rule, node="optional",
           message=STRENGTH_MESSAGE, tooltip=(
               "How much of the source to re-make: 1 = from noise (the source gives only the size and length); "
               "below 1 the first steps are skipped and sampling starts from the source noised to where the rest "
               "begins (diffusers' image-to-image rule). H3's schedule is shifted (12): 0.2 already restarts at "
               "sigma 0.75, 0.5 at 0.92 -- small values change a lot."),
           help="Strength from the source: 1 = from noise; below 1 the first steps are skipped (diffusers' img2img "
                "rule)."),
    Option("source_audio", "choice", "same", choices=("same", "keep", "regenerate"), stage="node", node="optional",
           tooltip=("The soundtrack with a source below denoise 1. same: noised and re-made like the video. keep: "
                    "the source's soundtrack exactly (held clean). regenerate: a new one from noise."),
           help="The soundtrack with a source: same (re-made at the strength), keep (the source's exactly), "
                "regenerate (from noise)."),
)

# H3 Refine's target (refine.py: refine_size) and its strength defaults; the node's widgets and refine's flags
REFINE_TARGETS = ("short_side", "scale", "size")
REFINE = OptionTable(
    Option("target", "choice", "short_side", choices=REFINE_TARGETS, stage="node", flag=None, tooltip=(
        "How the refined size is given: short side (the shorter side in pixels, the source's aspect kept), scale "
        "(x the source) or width x height. Each side lands on a multiple of 32, never below the source's. The other "
        "size widgets are ignored.")),
    Option("short_side", "int", 1088, minimum=32, maximum=4096, step=32, stage="node", tooltip=(
        "target short side: 1088 = 1080p on H3's 32-pixel grid (1344x768 -> 1920x1088)."),
           help="Target short side in pixels, the source's aspect kept (default 1088: 1344x768 -> 1920x1088)."),
    Option("scale", "float", 1.43, minimum=1.0, maximum=4.0, step=0.01, stage="node", tooltip=(
        "target scale: each side x this, then onto 32s (1.43: 1344x768 -> 1920x1088, the 768p -> 1080p step)."),
           help="Target scale: each side x this, onto multiples of 32."),
    Option("width", "int", 1920, minimum=32, maximum=4096, step=32, stage="node", flag=None,
           tooltip="target width x height: the width (a multiple of 32)."),  # the CLI's --size WxH
    Option("height", "int", 1088, minimum=32, maximum=4096, step=32, stage="node", flag=None,
           tooltip="target width x height: the height (a multiple of 32)."),
)

# How the engine runs (H3 Model Loader's choices and the CLI's engine flags)
ENGINE = OptionTable(
    Option("dtype", "choice", "bfloat16", choices=DTYPES, stage="engine", help="Default: bfloat16 on CUDA, float32 "
           "on the CPU.", tooltip="Compute precision of the transformer and text encoder. The checkpoint's float32 "
           "layers stay float32. bfloat16 is what the model was released in."),
    Option("attention", "choice", "sdpa", choices=attention_backends, stage="engine",
           message="Unknown attention backend {value!r}; available: {range}.",
           help="Attention backend (see the loader node's list); vsa: Video Sparse Attention, with --vsa-topk and "
                "--vsa-dense-steps; sage's settings after a colon, e.g. sage:scales=row.", tooltip="Attention kernel."),
    Option("adaln_cache", "bool", False, stage="engine", tooltip=(
        "Keep each step's AdaLN modulation tables on the GPU and the AdaLN projection weights (~24 GB of the "
        "released model) in host memory; tables are rebuilt only when a request brings new timesteps. Same output "
        "bit for bit. Falls back to the weights for a request whose tables would be larger than them.")),
    Option("weights", "choice", "bf16", choices=tuple(WEIGHT_FORMATS), stage="engine", flag=None, tooltip=(  # CLI: --fp8
        "bf16: the transformer's weights as released (in the dtype above). fp8: its blocks' matmul weights "
        "quantised to FP8 (e4m3, one scale per output channel) at load and run as FP8 matmuls with per-row "
        "activation scales on the FP8 tensor cores: the DiT's resident weights drop by ~19 GB (its matmul weights "
        "halve), at a small loss of precision. Needs an NVIDIA GPU with FP8 (RTX 40xx, L4/L40, H100/H200 or newer) "
        "and dtype bfloat16.")),
    resident_blocks_option(RELEASE_BLOCKS, RESIDENT_BLOCKS_HELP, help=(
        "DiT blocks kept on the GPU: all (every weight resident); auto (as many as fit beside the request's "
        "activations, the rest streamed from pinned host memory while earlier blocks compute; the text encoder and "
        "VAEs leave the GPU while the DiT runs when memory is short); or a number (0 streams every block). For GPUs "
        "smaller than the model.")),
    _vsa_setting("vsa_topk", 0.1, 0.001, 100000.0, 0.001,
                 "how many 4x4x4 video tiles each video tile attends besides the prompt and condition rows. Below 1: "
                 "a fraction of the clip's tiles (0.1 = 10%); 1 or more: a tile count.",
                 "video tiles (4x4x4) each video tile attends, a count (>= 1) or a fraction of the tiles (< 1; "
                 "default 0.1)."),
    _vsa_setting("vsa_dense_steps", 0.25, 0.0, 1000.0, 0.01,
                 "steps run with dense attention before the sparse ones. Below 1: a fraction of the steps (0.25 = "
                 "the first quarter); 1 or more: a step count.",
                 "steps run dense first, a count (>= 1) or a fraction of the steps (< 1; default 0.25)."),
    Option("attention_precision", "choice", "bf16", choices=PRECISIONS, stage="engine", node="optional",
           tooltip="With attention vsa: the operands of its sparse steps. bf16: the activations' dtype. sage: INT8 "
                   "Q.K^T and FP8 P.V (SAGE-style; lossy, faster on GPUs with FP8 tensor cores: RTX 40xx, L4/L40, "
                   "H100/H200 or newer; refused on others). The dense steps stay exact. Ignored by the other "
                   "attention kernels (the dense quantised one is attention sage).",
           help="With --attention vsa: bf16 (default) or sage (INT8 Q.K^T, FP8 P.V on the sparse steps; lossy)."),
)


def engine_attention(attention: str = "sdpa", vsa_topk: float | None = None, vsa_dense_steps: float | None = None,
                     attention_precision: str | None = None) -> AttentionSpec:
    """The engine config's attention for the attention option and, with vsa, its three settings (None: the
    defaults); the settings mean nothing to the other backends and are ignored there. The option may carry a
    backend's settings in their text form ("sage:scales=row", the CLI's --attention); vsa takes its own from the
    three settings, so "vsa:..." is refused with the flags' names."""
    from ...attention import vsa

    base, with_settings, _ = attention.partition(":")
    ENGINE["attention"].check(base)
    if with_settings and base == "vsa":
        raise ValueError(f"Attention {attention!r}: VSA's settings are --vsa-topk, --vsa-dense-steps and "
                         "--attention-precision, not 'vsa:...'.")
    if base != "vsa":
        return AttentionSpec.parse(attention)
    topk = ENGINE["vsa_topk"].default if vsa_topk is None else vsa_topk
    dense = ENGINE["vsa_dense_steps"].default if vsa_dense_steps is None else vsa_dense_steps
    precision = ENGINE["attention_precision"].default if attention_precision is None else attention_precision
    ENGINE.check({"vsa_topk": topk, "vsa_dense_steps": dense, "attention_precision": precision})
    return vsa.spec(topk, dense, precision)
