"""The `prompts` widget's JSON as the mask editor writes it (backend/media/track_prompts.py states the format), for
the Track Mask tests."""

import json


def prompts(*objects):
    return json.dumps({"version": 1, "objects": list(objects)})


def click(frame, x, y, positive=True):
    return {"frame": frame, "x": x, "y": y, "positive": positive}
