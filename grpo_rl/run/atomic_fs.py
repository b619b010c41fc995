"""Folders that appear whole or not at all: write under a temporary name, flush, rename into place.

:func:`atomic_folder` is how checkpoints and model exports are written (:mod:`grpo_rl.run.checkpoint`):

* the folder is filled under a temporary sibling ``.tmp-<name>-<pid>@<host>-<random>`` (same file system, so the
  rename is atomic), named after its writer so that :func:`remove_stale_tmp` can tell a live save from the debris
  of a killed one, and created with the process umask (``mkdtemp``'s 0700 would make checkpoints private);
* the finished folder is fsynced file by file (:func:`fsync_tree`), then renamed into place (:func:`publish`); an
  existing folder of that name is first moved aside to ``.old-<name>-<pid>`` and deleted only once the new one is
  in place, and :func:`recover_moved_aside` puts it back when the process died between the two renames;
* a full disk (or quota) is a :class:`DiskFullError` that says so and what is still intact, whichever library hid
  the errno; the partial folder is removed, so a full disk never leaves half a checkpoint behind.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from grpo_rl.errors import UserError

log = logging.getLogger(__name__)

# ``.tmp-<name>-<pid>@<host>-<random>``: the writer of a temporary folder, so that a look at the run folder
# from another process (an evaluation of a live run) never removes a save that is still being written.
_TMP_WRITER = re.compile(r"^\.tmp-.*-(\d+)@([^-]*)-[^-]*$")
# A temporary folder of another host is left alone unless it is older than this (no save takes a day).
_FOREIGN_TMP_MAX_AGE_S = 24 * 3600
_DISK_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# How safetensors and other libraries that hide the errno spell it.
_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded", "storagefull", "quotaexceeded")
# A write that fails with less than this free is taken as a full disk.
_NEARLY_FULL_BYTES = 64 * 2**20


class DiskFullError(UserError, OSError):
    """A checkpoint or export could not be written because the disk (or the user's quota) is full."""


@contextlib.contextmanager
def atomic_folder(final: Path, what: str, kept: str) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``final`` to fill; on success it is published as ``final`` (an existing
    one is replaced). ``what`` and ``kept`` name the write and what is still intact, for the message.

    Raises:
        DiskFullError: the disk or quota is full; nothing of this write is left behind.
    """
    tmp = None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = make_tmp(final.parent, final.name)
        yield tmp
        publish(tmp, final)
    except BaseException as e:
        free = free_bytes(final.parent)  # before the partial folder is removed, which frees space again
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full_error(e, what, final.parent, free, kept) if isinstance(e, Exception) else None
        if full is not None:
            raise full from e
        raise


def fsync_tree(path: Path) -> None:
    """Flush every file under ``path``, then ``path`` itself, to disk."""
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())  # no "-": it separates the parts of a tmp name


def make_tmp(parent: Path, name: str) -> Path:
    """A fresh hidden folder in ``parent``, named after its writer (pid and host)."""
    # In parent: the same file system, so the final rename is atomic; the writer in the name lets
    # remove_stale_tmp tell a live save from debris.
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".tmp-{name}-{os.getpid()}@{_host()}-"))
    os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp's 0700 would make checkpoints private to this user
    return tmp


def _process_umask() -> int:
    """This process's umask, read without changing it where Linux (4.7+) shows it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    # No Umask: line in /proc/self/status: set and put back, once, at import; 0o077 meanwhile, so that a file
    # another thread creates in that instant is only more private, never writable by others as under umask(0).
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


_UMASK = _process_umask()  # once: the umask is process-wide, and the run's threads create files


def publish(tmp: Path, final: Path) -> None:
    """Move the finished folder ``tmp`` to ``final``, replacing an existing one only once ``tmp`` is in place."""
    fsync_tree(tmp)
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, old)  # moved aside; a death before the next rename is undone by recover_moved_aside
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None and not final.exists():
            os.replace(old, final)  # put the old folder back
        raise
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def recover_moved_aside(root: Path) -> None:
    """Put back a folder that :func:`publish` moved aside when the process died before its replacement landed."""
    for old in root.glob(".old-*"):
        name = old.name[len(".old-") :].rsplit("-", 1)[0]
        if not (root / name).exists():
            os.replace(old, root / name)
            log.warning("restored %s, moved aside by a save that did not finish", root / name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    except OSError:
        return False
    return True


def _is_stale_tmp(folder: Path) -> bool:
    """Whether a ``.tmp-*`` folder is debris: its writer is this process (whose saves are over), a dead process
    of this host, unknown (an older naming), or another host's and more than a day old."""
    match = _TMP_WRITER.match(folder.name)
    if match is None:
        return True
    pid, host = int(match.group(1)), match.group(2)
    if host == _host():
        return pid == os.getpid() or not _pid_alive(pid)
    try:
        return time.time() - folder.stat().st_mtime > _FOREIGN_TMP_MAX_AGE_S
    except OSError:
        return False


def remove_stale_tmp(root: str | Path) -> int:
    """Remove the ``.tmp-*`` folders that interrupted saves left in ``root`` (not a live process's); returns how
    many."""
    root = Path(root)
    if not root.is_dir():
        return 0
    removed = 0
    for tmp in root.glob(".tmp-*"):
        if tmp.is_dir() and _is_stale_tmp(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            removed += not tmp.exists()
    return removed


def _errors_of(error: BaseException):
    """``error`` and the exceptions it was raised from or while handling."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def free_bytes(path: Path) -> int | None:
    """Free bytes on the disk that holds ``path`` (or its nearest existing parent); None if unknown."""
    for p in (path, *path.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


def disk_full_error(error: BaseException, what: str, target: Path, free: int | None, kept: str) -> DiskFullError | None:
    """A :class:`DiskFullError` for ``error`` if a full disk caused it, else None; ``free`` is the free bytes on
    ``target``'s disk when the write failed, ``what`` and ``kept`` as for :func:`atomic_folder`."""
    code = None
    for e in _errors_of(error):
        if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
            code = e.errno
            break
        text = str(e).lower()
        if any(t in text for t in _DISK_FULL_TEXT):
            code = errno.EDQUOT if "quota" in text and hasattr(errno, "EDQUOT") else errno.ENOSPC
            break
    if code is None:
        # torch.save says only "file write failed": a failed write on a nearly full disk is taken as full.
        if (
            "write" not in str(error).lower()
            or not isinstance(error, (OSError, RuntimeError))
            or free is None
            or free >= _NEARLY_FULL_BYTES
        ):
            return None
        code = errno.ENOSPC
    if code == errno.ENOSPC:
        cause = f"the disk is full ({os.strerror(code)}, ENOSPC"
    else:
        cause = f"your disk quota is used up ({os.strerror(code)}, EDQUOT"
    now = free_bytes(target)
    cause += f"; {now / 2**20:.0f} MiB free now)" if now is not None else ")"
    full = DiskFullError(
        f"cannot write {what}: {cause}. Free space on that disk, or set output_dir to a folder on "
        f"another disk (train.keep_checkpoints=1 keeps fewer checkpoints). The partial folder was "
        f"removed; {kept}"
    )
    full.errno = code
    return full
