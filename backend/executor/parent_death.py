"""Processes that end with the one that started them: the kernel's parent-death signal (Linux prctl
PR_SET_PDEATHSIG, through ctypes).

The chain this gives: host -> forkserver (worker_preload asks for it first thing, before the ~7 s of imports, so a host
killed while the server still imports leaves nothing behind) -> worker ranks (worker_main). A host that dies by
SIGKILL or a default SIGTERM (no exit hook runs) thus takes its whole tree with it within milliseconds. The liveness
channel (the heartbeat's orphan check on the host's sentinel) stays the fallback where there is no prctl (macOS,
Windows) and for a parent that was not the one asked for.

The kernel sends the signal when the *thread* that forked the child ends, not the process: a child forked from a
short-lived thread would be killed with that thread. So callers ask for it only where the forking thread lives as
long as its process (a forkserver's single thread; a host's main thread).
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(signum: int = signal.SIGKILL, parent_pid: int | None = None) -> bool:
    """Have the kernel send `signum` to this process when its parent (thread) ends; True when it is armed.
    `parent_pid`: the parent expected; when it is already gone (it died before the request was made, and this process
    was re-parented) the process exits at once, as the signal would have made it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(int(signum)), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) != 0:
            return False
    except (OSError, AttributeError, TypeError):  # no libc with prctl (musl without it, a sandbox)
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(128 + int(signum))
    return True
