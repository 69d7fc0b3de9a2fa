"""Widget declarations several nodes share, stated once so their ranges, defaults and tooltips cannot drift."""

from __future__ import annotations

def sampling_inputs(*names: str, steps_tooltip: str = "", seed_tooltip: str = "") -> dict:
    """The H3 nodes' steps / shift / seed widgets in the order given, from their one declaration (pipelines/h3/
    options.py SAMPLING), with a node's own wording for steps and seed where it has one."""
    from ..backend.pipelines.h3.options import SAMPLING

    own = {"steps": steps_tooltip, "seed": seed_tooltip}
    return SAMPLING.inputs(*names, **{n: SAMPLING[n].with_(tooltip=t) for n, t in own.items() if t and n in names})


def sampling_extras() -> dict:
    """The optional inputs of every sampling option declared after the nodes' saved widgets (appended: saved
    workflows keep their order); the node passes them to its request by name (sampling_fields)."""
    from ..backend.pipelines.h3.options import SAMPLING

    return SAMPLING.node_inputs("optional")


def sampling_fields(more: dict) -> dict:
    """A node's extra sampling widgets -> its request's fields (an unset value -> None)."""
    from ..backend.pipelines.h3.options import SAMPLING

    unknown = sorted(set(more) - {o.name for o in SAMPLING})
    if unknown:
        raise TypeError(f"unexpected inputs {unknown}")
    return {name: SAMPLING[name].value(value) for name, value in more.items()}


DEVICES = ("auto", "cuda", "cpu")
DEVICE_INPUT = {
    "device": (list(DEVICES), {"default": "auto", "tooltip": "auto: the first CUDA GPU if there is one, else the CPU."}),
}
GPUS_INPUT = {
    "gpus": ("STRING", {
        "default": "",
        "tooltip": "GPU ids for the ranks, e.g. 0,1,2,3 (one per rank). Empty: GPUs 0..N-1. 'all': every visible "
                   "GPU, and the degree becomes their count."}),
}


def attention_input(names: list[str], descriptions: dict[str, str]) -> dict:
    """The attention-kernel combo over `names` (a loader's list), each described in the tooltip."""
    return {"attention": (names, {
        "default": "sdpa",
        "tooltip": "Attention kernel: " + "; ".join(f"{n}: {descriptions[n]}" for n in names if n in descriptions)
                   + "."})}


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def check_device(device) -> bool | str:
    """A loader's VALIDATE_INPUTS for its `device` widget: True, or what to change."""
    if device not in DEVICES:
        return f"device must be auto, cuda or cpu, got {device!r}."
    if device == "cuda" and not cuda_available():
        return "device is 'cuda' but no CUDA GPU is visible to ComfyUI; choose 'auto' or 'cpu'."
    return True
