"""An Mp4Writer in a child process, fed through host buffers both processes map, so encoding never holds the GIL of
the process that launches GPU work.

Why: a launch-bound decoder (the released H3 VAE issues ~600k kernels per 10-s decode, 17 s of CPU for 13.5 s of GPU
time) slowed by 10-31% (H200 runs) when an encoder thread in the same process held the GIL for frame conversion and
muxing, and lowering that thread's priority made it worse (the GIL holder was preempted). docs/BENCHMARKS.md,
"Decode streamed into the MP4", has the numbers.

Protocol (one child per file; `multiprocessing.connection` over a socket pair, pickled tuples):
    parent -> child: ("open", buffer paths, buffer shape, writer args, writer kwargs, nice)
                     ("frames", buffer index, count, yuv)  ("audio", waveform ndarray, rate)  ("close",)  ("abort",)
    child -> parent: ("ready",) after "open"; ("ok", value) after every other message; ("error", exception) instead
                     of either (the child then aborts the file and exits)
The buffers are files in /dev/shm (else the temp folder) that the parent creates and maps; the child maps them and
removes their names. The child starts in its own session (a terminal's Ctrl-C goes to the parent, which decides), and
exits when the socket closes, so a dead parent leaves no encoder behind; an unfinished file is never published
(Mp4Writer's temp-file rule).
"""

from __future__ import annotations

import mmap
import os
import secrets
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection

import numpy as np

_BOOT = "import sys; from comfyui_h3.backend.media.encoder_process import serve; serve(int(sys.argv[1]))"
_START_TIMEOUT_S = 60.0


def supported() -> bool:
    """Child encoders need fork/exec with fd passing and shared file mappings: POSIX."""
    return os.name == "posix"


def _free_bytes(folder: str) -> int:
    try:
        stats = os.statvfs(folder)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def _buffer_folder(nbytes: int = 0) -> str:
    """/dev/shm when it has room for the buffers twice over (a container's default /dev/shm is 64 MB, and a mapped
    file past a full tmpfs faults with SIGBUS on write, so room is checked, never assumed), else the temp folder."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and _free_bytes(shm) >= 2 * nbytes:
        return shm
    folder = tempfile.gettempdir()
    if _free_bytes(folder) < 2 * nbytes:
        raise OSError(f"no room for {nbytes / 2**20:.0f} MiB of encoder buffers in /dev/shm or {folder}")
    return folder


class SharedBuffers:
    """`count` uint8 arrays of `shape`, each a mapped file the child maps too (names removed once it has)."""

    def __init__(self, count: int, shape: tuple[int, ...]):
        self.shape = tuple(int(n) for n in shape)
        self.nbytes = int(np.prod(self.shape))
        self.paths: list[str] = []
        self._maps: list[mmap.mmap] = []
        folder = _buffer_folder(count * self.nbytes)
        try:
            for _ in range(count):
                path = os.path.join(folder, f"h3-encoder-{os.getpid()}-{secrets.token_hex(6)}")
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                self.paths.append(path)
                try:
                    os.ftruncate(fd, self.nbytes)
                    self._maps.append(mmap.mmap(fd, self.nbytes))
                finally:
                    os.close(fd)
        except BaseException:
            self.close()
            raise
        self.arrays = [np.frombuffer(m, dtype=np.uint8).reshape(self.shape) for m in self._maps]

    def unlink(self) -> None:
        for path in self.paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.paths = []

    def close(self) -> None:
        self.unlink()
        self.arrays = []
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # a tensor still views it: the mapping goes when that does
                pass
        self._maps = []


class EncoderProcess:
    """Parent side: starts the child, then `call("frames" | "audio" | "close" | "abort", ...)` are blocking round
    trips (the socket calls release the GIL), made from one thread only (the saver's background thread). Errors the
    child reports are re-raised here as the child's exception."""

    def __init__(self, buffers: SharedBuffers, writer_args: tuple, writer_kwargs: dict, nice: int = 0):
        import comfyui_h3

        parent, child = socket.socketpair()
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(comfyui_h3.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            self._proc = subprocess.Popen([sys.executable, "-c", _BOOT, str(child.fileno())], env=env,
                                          pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                          start_new_session=True, close_fds=True)
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        self._ready = False
        self._conn.send(("open", list(buffers.paths), buffers.shape, tuple(writer_args), dict(writer_kwargs),
                         int(nice)))

    def _reply(self):
        try:
            if not self._ready:
                if not self._conn.poll(_START_TIMEOUT_S):
                    raise RuntimeError(f"the encoder process did not start within {_START_TIMEOUT_S:.0f} s")
                kind, *rest = self._conn.recv()
                if kind == "error":
                    raise rest[0]
                self._ready = True
            kind, *rest = self._conn.recv()
        except (EOFError, OSError) as error:
            code = self._proc.poll()
            raise RuntimeError(f"the encoder process ended unexpectedly (exit code {code})") from error
        if kind == "error":
            raise rest[0]
        return rest[0] if rest else None

    def call(self, *message):
        self._conn.send(message)
        return self._reply()

    def shutdown(self, timeout: float = 10.0) -> None:
        try:
            self._conn.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def serve(fd: int) -> None:
    """The child: open the writer, then encode what the parent sends until close / abort / the socket ends."""
    import signal

    from .encode import Mp4Writer

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    writer = None
    try:
        _, paths, shape, args, kwargs, nice = conn.recv()
        if nice > 0:
            os.nice(nice)
        arrays = []
        for path in paths:
            with open(path, "r+b") as handle:
                arrays.append(np.frombuffer(mmap.mmap(handle.fileno(), int(np.prod(shape))), np.uint8).reshape(shape))
            os.unlink(path)
        writer = Mp4Writer(*args, **kwargs)
        conn.send(("ready",))
        while True:
            message = conn.recv()
            kind = message[0]
            if kind == "frames":
                _, index, count, yuv = message
                (writer.write_yuv420p if yuv else writer.write_frames)(arrays[index][:count])
                conn.send(("ok", writer.frames_written))
            elif kind == "audio":
                writer.write_audio(message[1], sample_rate=message[2])
                conn.send(("ok",))
            elif kind == "close":
                writer.close()
                conn.send(("ok", writer.frames_written))
                return
            elif kind == "abort":
                writer.abort()
                conn.send(("ok",))
                return
    except EOFError:  # the parent went away: nothing is published
        if writer is not None:
            writer.abort()
    except BaseException as error:  # noqa: BLE001 - handed to the parent
        if writer is not None:
            writer.abort()
        try:
            conn.send(("error", error))
        except Exception:  # noqa: BLE001 - e.g. an unpicklable exception: send its text
            try:
                conn.send(("error", RuntimeError(f"{type(error).__name__}: {error}")))
            except OSError:
                pass
