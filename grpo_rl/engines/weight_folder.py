"""The folder of the ``grpo_rl_file`` weight transport, both sides of it: where the trainer writes a push
(:class:`RunFolder`, used by :class:`~grpo_rl.engines.served.ServedEngine`) and how a server reads it back
(:func:`read_weight_file`, used by :mod:`grpo_rl.engines.file_transfer`).

Nothing in a folder that other users can write to is trusted:

* **A folder of the run's own.** Each engine makes one with ``mkdtemp`` (mode 0700) inside ``/dev/shm`` or inside
  ``inference_model.weight_dir``, and removes it at shutdown. A given folder must belong to the user (or root) and be
  writable by no one else, unless it has the sticky bit (as ``/tmp`` has: others may add entries but not rename or
  remove ours); the same holds for each folder above it (:func:`check_weight_dir`).
* **Files nobody can plant or guess.** A push is one file with a random name, created with ``O_CREAT | O_EXCL |
  O_NOFOLLOW`` and mode 0600, so a name planted in advance (a symlink, say) makes the write fail instead of being
  followed. A write that fails removes what it wrote.
* **Checked before loading.** The file's SHA-256 travels in the update; the server opens the file without following a
  symlink, refuses anything but a regular file, reads it once and loads those same bytes only if the hash matches.
* **Debris swept.** A killed run leaves its folder behind. Each folder is named after its creator
  (``grpo_rl_weights_<pid>@<host>-``) and holds a ``.lock`` that the creator keeps ``flock``-ed while it lives; a new
  folder first removes the ones of this user and host whose lock is free and whose creator is gone
  (:func:`sweep_stale`). The lock, not the pid alone, decides: runs in containers that share ``/dev/shm`` and the
  host name see each other's pids as dead.

The file is built in memory (``safetensors.torch.save``) before it is written: one transient copy of the weights,
where ``save_file`` would stream them, because ``save_file`` opens the path itself, with no way to ask for
``O_EXCL | O_NOFOLLOW``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from grpo_rl.errors import ConfigError

log = logging.getLogger(__name__)

PREFIX = "grpo_rl_weights_"
LOCK = ".lock"
_NAME = re.compile(rf"^{PREFIX}(\d+)@([A-Za-z0-9._]+)-")


def default_parent() -> Path:
    """Where an engine's folder goes without ``inference_model.weight_dir``: ``/dev/shm`` (memory, not disk)."""
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


def check_weight_dir(weight_dir: str) -> Path:
    """``inference_model.weight_dir`` resolved, once checked safe to make a private folder in: it exists, and it and
    every folder above it belong to this user or root and are writable by no one else unless sticky. Raises
    :class:`ConfigError` naming the setting and the fix."""
    folder = Path(weight_dir).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(
            f"inference_model.weight_dir={weight_dir}: no such folder; create it with "
            f"`mkdir -m 700 {folder}`, or set inference_model.weight_dir=null (a private folder in "
            "/dev/shm)"
        )
    for path in (folder, *folder.parents):
        problem = _unsafe(path)
        if problem is not None:
            raise ConfigError(
                f"inference_model.weight_dir={weight_dir}: {problem}, so another user could replace "
                "the weights the servers load; use a folder of yours that only you can write to "
                "(`mkdir -m 700 DIR`), or set inference_model.weight_dir=null (a private folder in "
                "/dev/shm)"
            )
    return folder


def _unsafe(path: Path) -> str | None:
    """Why another user could rename or remove entries of ``path``, or None if none can."""
    st = path.stat()
    if st.st_uid not in (os.geteuid(), 0):
        return f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}, no sticky bit)"
    return None


class RunFolder:
    """An engine's private folder for weight files, in ``parent`` (checked by :func:`check_weight_dir`, or
    :func:`default_parent`): stale folders there are swept first; the folder is locked while this object lives and
    removed by :meth:`close`."""

    def __init__(self, parent: Path):
        sweep_stale(parent)
        self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}@{_host()}-", dir=parent))  # mode 0700
        self._lock: int | None = os.open(self.path / LOCK, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # released by the kernel however this process ends

    def write(self, data: bytes, stem: str) -> str:
        """Write ``data`` to a new file ``<stem>_<random>.safetensors`` (mode 0600) and return its name; a write
        that fails leaves no file behind."""
        name = f"{stem}_{secrets.token_hex(16)}.safetensors"
        path = self.path / name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY, 0o600)
        try:
            with open(fd, "wb") as f:
                f.write(data)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return name

    def remove(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)

    def close(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            os.close(lock)


def sweep_stale(parent: Path) -> list[Path]:
    """Remove the folders in ``parent`` that killed runs of this user on this host left; returns them. A folder
    is stale when its lock is free and its creator's pid is gone; symlinks and other users' folders are left alone."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is None or match.group(2) != _host() or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
            continue
        folder = Path(entry.path)
        if _pid_alive(int(match.group(1))) or _locked(folder):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
        log.info("removed %s, the weight folder of a run that ended without removing it", folder)
    return removed


def _locked(folder: Path) -> bool:
    """Whether a live process holds ``folder``'s lock (a folder without one yet is being made, or predates it)."""
    try:
        fd = os.open(folder / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, another user's; anything else: keep the folder
        return True
    return True


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())  # no "-" or "@": they delimit the parts of a name


def read_weight_file(directory: Path, name: str, sha256: str) -> bytes:
    """The server's side: the bytes of weight file ``name`` in ``directory``, read once. Raises ``ValueError`` for a
    name that leaves the folder, a symlink, anything but a regular file, or bytes whose SHA-256 is not ``sha256``."""
    if name in ("", ".", "..") or os.path.basename(name) != name:
        raise ValueError(f"weight file {name!r} is not in the weight folder")
    path = directory / name
    try:  # O_NONBLOCK: a FIFO planted under the name must not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"weight file {path} is a symbolic link; refused") from e
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"weight file {path} is not a regular file; refused")
        with open(fd, "rb", closefd=False) as f:
            data = f.read()
    finally:
        os.close(fd)
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ValueError(
            f"weight file {path} has SHA-256 {digest}, but the trainer wrote {sha256}: it was changed "
            "after it was written; refused"
        )
    return data
