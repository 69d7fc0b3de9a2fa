"""What engine config the CLI's generate / edit / extend build for some flags, without running an engine (the
weight-policy and attention options are checked through it)."""

from __future__ import annotations


def engine_configs_for(monkeypatch, flags: list[str], request) -> list:
    """The EngineConfig each of generate, edit and extend asks the engine registry for with `flags` (CPU)."""
    import comfyui_h3.backend.engine as engine_module
    from comfyui_h3.cli import _parser
    from comfyui_h3.cli_generate import run_on_engine

    seen = []

    class FakeEngine:
        def generate(self, request, progress=None, should_cancel=None):
            return "result"

        def shutdown(self):
            pass

    monkeypatch.setattr(engine_module, "get_engine", lambda config: seen.append(config) or FakeEngine())
    for command in (["generate", "--prompt", "x"], ["edit", "--video", "v.mp4", "--mask", "m.png", "--prompt", "x",
                                                      "--out", "o.mp4"],
                    ["extend", "--video", "v.mp4", "--prompt", "x", "--seconds", "5", "--out", "o.mp4"]):
        args = _parser().parse_args(command + flags)
        args.device = "cpu"
        assert run_on_engine(args, "/models/h3", request, "denoise") == "result"
    return seen
