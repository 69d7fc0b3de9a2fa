"""Widget declarations several nodes share, stated once so their ranges, defaults and tooltips cannot drift."""

SHIFT_INPUTS = {
    "video_shift": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100.0, "step": 0.1,
                              "tooltip": "Flow-match sigma shift of the video schedule; 0 = the model folder's "
                                         "(scheduler/scheduler_config.json: 12 for the release)."}),
    "audio_shift": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100.0, "step": 0.1,
                              "tooltip": "Flow-match sigma shift of the audio schedule; 0 = the model folder's "
                                         "(audio_scheduler/scheduler_config.json: 3 for the release)."}),
}
