"""Re-deliver the wake-up that ComfyUI's prompt queue can lose when POST /free (Unload Models) sets its flag.

Core (v0.8.0 and v0.33.0 alike): ``PromptQueue.set_flag`` stores the flag and calls ``not_empty.notify()``; the prompt
worker thread reads the flags once per loop, after ``q.get(timeout=...)`` returns. A flag set while that thread is
between its ``get_flags()`` and its next wait (unloading, ``gc.collect()``, emptying caches: seconds on a loaded
machine) wakes no one, and the thread then sleeps in ``q.get(timeout=1000.0)``: the unload, and our engine's shutdown
with it, waits for the next prompt. The wrapper below notifies again a few times over the next seconds while the flag
is still unread. A notify while a prompt runs is a no-op (no one waits); the worker reads the flags after that prompt,
as before, so the unload still happens on the prompt worker thread, between prompts.
"""

from __future__ import annotations

import functools
import threading
import time

__all__ = ["install_flag_redelivery"]

_MARK = "_comfyui_h3_redelivers_flags"
# Together ~16 s: longer than any gap between a worker's get_flags() and its next wait seen under load.
REDELIVERY_DELAYS_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


def install_flag_redelivery(queue_class) -> bool:
    """Wrap ``queue_class.set_flag`` (once; a second call sees the mark). Returns False when it has none."""
    set_flag = getattr(queue_class, "set_flag", None)
    if set_flag is None:
        return False
    if getattr(set_flag, _MARK, False):
        return True

    @functools.wraps(set_flag)
    def redelivering_set_flag(self, *args, **kwargs):
        result = set_flag(self, *args, **kwargs)
        _redeliver_until_read(self)
        return result

    setattr(redelivering_set_flag, _MARK, True)
    queue_class.set_flag = redelivering_set_flag
    return True


def _redeliver_until_read(queue) -> None:
    mutex, not_empty = getattr(queue, "mutex", None), getattr(queue, "not_empty", None)
    if mutex is None or not_empty is None:  # not core's queue layout: nothing we can notify safely
        return

    def run() -> None:
        for delay in REDELIVERY_DELAYS_S:
            time.sleep(delay)
            with mutex:
                if not getattr(queue, "flags", None):  # the worker took them (get_flags resets the dict)
                    return
                not_empty.notify()

    threading.Thread(target=run, name="comfyui-h3-queue-flags", daemon=True).start()
