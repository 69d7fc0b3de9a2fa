"""The files one CLI command makes, all or nothing.

Each output is checked before any work (its name is free, its folder can be made and written: a path under a file
or under /proc fails here, not after the generation), written under a hidden temporary name beside its final name
while the command runs, and published with the others at the end (`publish`): either every output appears under
its name, or none does and nothing is left behind. A write that fails (a full disk, a read-only folder) becomes an
OutputError naming the file and the cause, in one line.

    outputs = CliOutputs()
    video = outputs.add(args.out)                     # FileExistsError / OutputError now, before any work
    with outputs:                                     # an exception inside removes every temporary
        outputs.write(video, lambda tmp: write_mp4(tmp, ..., reserved=True))
        paths = outputs.publish()
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets

from .backend.media.encode import next_free_path, release_placeholder, reserve_path


class OutputError(OSError):
    """An output cannot be written; the message names it and says why (`errno` kept, not printed)."""

    def __init__(self, code: int | None, message: str):
        super().__init__(message)
        self.errno = code


def describe_write_error(exc: BaseException) -> str:
    """The cause of a failed write, short: "No space left on device", not a nested traceback."""
    seen = exc
    while seen is not None:  # the encoder thread wraps the OSError that stopped it
        if isinstance(seen, OSError) and (seen.strerror or seen.errno):
            return seen.strerror or os.strerror(seen.errno)
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    reported = _REPORTED_OS_ERROR.search(text)  # a worker's report carries the OSError as text
    if reported:
        return os.strerror(int(reported.group(1)))
    if "No space left" in text or "StorageFull" in text:  # safetensors reports io errors as text
        return os.strerror(errno.ENOSPC)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


_REPORTED_OS_ERROR = re.compile(r"\[Errno (\d{1,3})\] ")  # an OS errno (FFmpeg's codes are larger)


def write_errno(exc: BaseException) -> int | None:
    """The errno of a failed write: the first OSError's in the chain, or the one a report names as text."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    reported = _REPORTED_OS_ERROR.search(str(exc))
    if reported:
        return int(reported.group(1))
    return errno.ENOSPC if describe_write_error(exc) == os.strerror(errno.ENOSPC) else None


def check_writable(path: str) -> str:
    """-> absolute `path` when a new file can be created there; OutputError naming what is in the way otherwise.
    Creates nothing that stays (a probe file in the nearest existing folder, removed at once)."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise OutputError(errno.EISDIR, f"Cannot write {path}: it is a folder; give a file name.")
    folder = os.path.dirname(path)
    existing = folder
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise OutputError(errno.ENOTDIR, f"Cannot write {path}: {existing} is a file, not a folder.")
    probe = os.path.join(existing, f".h3-write-probe-{secrets.token_hex(4)}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise OutputError(exc.errno, f"Cannot write {path}: files cannot be created in {existing} "
                                     f"({describe_write_error(exc)}).") from None
    os.close(fd)
    os.unlink(probe)
    return path


class CliOutputs:
    def __init__(self):
        self._items: list[dict] = []
        self.published: list[str] = []

    def add(self, path: str) -> str:
        """Plan an output at `path` (must not exist); -> its absolute path."""
        path = check_writable(path)
        if os.path.lexists(path):
            raise FileExistsError(f"{path} exists; choose another name (outputs are never overwritten).")
        if any(item["final"] == path for item in self._items):
            raise ValueError(f"{path} is named for two outputs; give each its own name.")
        self._items.append({"final": path, "numbered": None, "staged": None})
        return path

    def add_numbered(self, folder: str, prefix: str, ext: str) -> str:
        """Plan an output named `<folder>/<prefix>_NNNNN<ext>`, the first free number at publish time; -> a key for
        `write` / `stage` (the final name is in `publish`'s result)."""
        folder = os.path.abspath(folder)
        check_writable(os.path.join(folder, f"{prefix}_00001{ext}"))
        key = os.path.join(folder, f"{prefix}_NNNNN{ext}")
        self._items.append({"final": key, "numbered": (folder, prefix, ext), "staged": None})
        return key

    def _item(self, key: str) -> dict:
        for item in self._items:
            if item["final"] == key:
                return item
        raise KeyError(key)

    def stage(self, key: str) -> str:
        """A hidden, empty, reserved file beside the output's final name for the writer to publish onto (an
        Mp4Writer with reserved=True, or a worker streaming into it); -> its path."""
        item = self._item(key)
        folder = os.path.dirname(key)
        try:
            os.makedirs(folder, exist_ok=True)
            while True:
                staged = os.path.join(folder, f".{os.path.basename(key)}.{secrets.token_hex(4)}.part")
                try:
                    item["staged"] = item["was_staged"] = reserve_path(staged)
                    return staged
                except FileExistsError:
                    continue
        except OSError as exc:
            raise OutputError(exc.errno, f"Cannot write {key}: {describe_write_error(exc)}.") from None

    def write(self, key: str, writer) -> None:
        """Run `writer(temporary_path)` to make the output's content (the temporary is an empty reserved file);
        a failure becomes OutputError naming the output."""
        staged = self.stage(key)
        mode = os.stat(staged).st_mode & 0o777  # the placeholder's: a new file's under the umask
        try:
            writer(staged)
            if os.stat(staged).st_mode & 0o777 != mode:  # safetensors' save_file makes its file 0600
                os.chmod(staged, mode)
        except (OSError, RuntimeError) as exc:
            raise OutputError(getattr(exc, "errno", None), f"Could not write {key}: {describe_write_error(exc)}.") \
                from None
        except Exception as exc:
            if type(exc).__name__ == "SafetensorError":
                raise OutputError(None, f"Could not write {key}: {describe_write_error(exc)}.") from None
            raise

    @contextlib.contextmanager
    def naming_failures(self):
        """For a worker that streams into a staged output: an error that names the hidden temporary (the staged
        `.<name>.<hex>.part`, or its writer's `..<name>.<hex>.part.<hex>.tmp`) becomes OutputError naming the
        output the user asked for, with the cause in short ("No space left on device")."""
        try:
            yield
        except Exception as exc:
            failed = self.failed_write(exc)
            if failed is None:
                raise
            raise failed from None

    def failed_write(self, exc: BaseException) -> "OutputError | None":
        """OutputError naming the output whose temporary `exc` mentions, else None."""
        text = str(exc)
        for item in self._items:
            staged = item.get("staged") or item.get("was_staged")
            if staged and os.path.basename(staged) in text:
                return OutputError(write_errno(exc), f"Could not write {item['final']}: {describe_write_error(exc)}.")
        return None

    def publish(self) -> list[str]:
        """Move every staged output to its final name, never over an existing file; if one cannot be published,
        the ones this call already published are taken back and the error raised. -> the final paths."""
        done: list[str] = []
        try:
            for item in self._items:
                if item["staged"] is None:
                    raise RuntimeError(f"{item['final']} was never written")
                done.append(self._publish_one(item))
        except BaseException as exc:
            for path in done:
                _unlink_quietly(path)
            if isinstance(exc, OSError) and not isinstance(exc, (FileExistsError, OutputError)):
                raise OutputError(exc.errno, f"Could not publish the outputs: {describe_write_error(exc)}.") from None
            raise
        self.discard()  # the hard-linked temporaries
        self.published = done
        return done

    def _publish_one(self, item: dict) -> str:
        if item["numbered"] is not None:
            final = next_free_path(*item["numbered"])  # an empty placeholder we own: replaced by the content
            try:
                os.replace(item["staged"], final)
            except BaseException:
                release_placeholder(final)
                raise
            item["staged"] = None
            return final
        final = item["final"]
        try:
            os.link(item["staged"], final)  # atomic, and fails when the name was taken meanwhile
        except FileExistsError:
            raise FileExistsError(f"{final} appeared while the command ran; nothing was published "
                                  "(outputs are never overwritten).") from None
        except OSError:  # a file system without hard links: claim the name, then replace our own claim
            reserve_path(final)
            os.replace(item["staged"], final)
            item["staged"] = None
        return final

    def discard(self) -> None:
        """Remove every temporary (nothing was published)."""
        for item in self._items:
            if item["staged"] is not None:
                _unlink_quietly(item["staged"])
                item["staged"] = None

    def __enter__(self) -> "CliOutputs":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.discard()


def _unlink_quietly(path: str | None) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
