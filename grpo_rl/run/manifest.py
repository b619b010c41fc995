"""The manifest of a folder: every file's size and SHA-256 when the folder was written, checked before it is read.

A checkpoint holds ``manifest.json``, written last, before the folder is renamed into place::

    {"format": 1, "hash": "sha256", "files": {"model/model.safetensors": {"size": 538090408, "sha256": "9f2c..."},
                                              "trainer_state.pt": {...}, ...}}

:func:`find_damage` compares the folder with it: a file that is missing, has another size (a copy cut short, a full
disk during a later copy) or other bytes (bit rot, a file written over) is named with what was expected and what
was found, before anything is loaded. Sizes are compared first, so a truncated file is reported without hashing
anything. Files added after the manifest was written (an evaluation's ``eval_results.json``) are not checked.

SHA-256 rather than a cheaper checksum (CRC-32): ``sha256sum`` checks the same numbers by hand and a changed byte is
never missed by chance, for a cost measured small against a run's time between checkpoints where the CPU has SHA
extensions (``benchmarks/micro/checkpoint_manifest.py``; the figures and the trade-off are in ``benchmarks/README.md``).
Files are hashed in parallel threads (hashlib releases the GIL). A folder found intact or damaged is not hashed
again while none of its files changes (same size, modification time and inode), so the checks of one resume (the
run folder at start, then the load) read it once.

:func:`checkpoint_damage` applies this to a checkpoint, and to one written before manifests existed the checks that
need none (its JSON files and safetensors headers); :func:`verify_checkpoint` and :func:`damaged_file_error` turn
what is found into a :class:`CheckpointDamagedError` that names the file and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from grpo_rl.errors import RunFolderError

MANIFEST_NAME = "manifest.json"
FORMAT = 1
_CHUNK_BYTES = 8 << 20
_MAX_THREADS = 8

# folder (resolved) -> (stat signature of its manifest and listed files, what find_damage found then, its file
# relative to the folder)
_CHECKED: dict[str, tuple[tuple, Damage | None]] = {}


class CheckpointDamagedError(RunFolderError, OSError):
    """A file of a checkpoint is missing, cut short or changed since the checkpoint was written."""


@dataclass(frozen=True)
class Damage:
    """One file of a folder that does not match the folder's manifest, and what is wrong with it (what was
    expected and what was found: ``is 1000 bytes, but 538090408 were written``)."""

    file: Path
    problem: str

    def __str__(self) -> str:
        return f"{self.file} {self.problem}"


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, as hex (what ``sha256sum`` prints)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _hash_all(files: list[Path]) -> list[str]:
    if len(files) <= 1:
        return [file_sha256(f) for f in files]
    workers = min(len(files), os.cpu_count() or 1, _MAX_THREADS)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="manifest") as pool:
        return list(pool.map(file_sha256, files))


def write_manifest(folder: Path) -> Path:
    """Write ``folder/manifest.json`` listing every file under ``folder`` (relative path, size, SHA-256); returns
    it. Call when nothing more will be written to the folder."""
    folder = Path(folder)
    manifest = folder / MANIFEST_NAME
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p != manifest)
    hashes = _hash_all(files)
    entries = {
        f.relative_to(folder).as_posix(): {"size": f.stat().st_size, "sha256": h}
        for f, h in zip(files, hashes, strict=True)
    }
    manifest.write_text(json.dumps({"format": FORMAT, "hash": "sha256", "files": entries}, indent=1) + "\n")
    return manifest


def has_manifest(folder: Path) -> bool:
    """Whether ``folder`` was written with a manifest (checkpoints written before manifests existed have none)."""
    return (Path(folder) / MANIFEST_NAME).is_file()


def _read_entries(folder: Path) -> dict[str, dict] | Damage:
    manifest = folder / MANIFEST_NAME
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        entries = data["files"]
        if data.get("hash") != "sha256" or not isinstance(entries, dict):
            raise ValueError(f"hash {data.get('hash')!r}, files of type {type(entries).__name__}")
        for name, entry in entries.items():
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ValueError(f"a path outside the folder: {name!r}")
            if not (
                isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
            ):
                raise ValueError(f"the entry of {name!r} is not {{size, sha256}}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return Damage(manifest, f"cannot be read as a manifest ({type(e).__name__}: {str(e)[:200]})")
    return entries


def _signature(folder: Path, names) -> tuple:
    out = []
    for name in (MANIFEST_NAME, *names):
        try:
            st = (folder / name).stat()
            out.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            out.append((name, None))
    return tuple(out)


def find_damage(folder: Path) -> Damage | None:
    """The first file of ``folder`` that does not match its manifest, or None when every listed file matches (or
    the folder has no manifest: see :func:`has_manifest`)."""
    folder = Path(folder)
    entries = _read_entries(folder)
    if isinstance(entries, Damage):
        return entries
    key, signature = str(folder.resolve()), _signature(folder, entries)
    cached = _CHECKED.get(key)  # hashed again only when a file changed since this process last checked
    if cached is not None and cached[0] == signature:
        return cached[1] if cached[1] is None else Damage(folder / cached[1].file, cached[1].problem)
    damage = _compare(folder, entries)
    _CHECKED[key] = (signature, None if damage is None else Damage(damage.file.relative_to(folder), damage.problem))
    return damage


def _compare(folder: Path, entries: dict[str, dict]) -> Damage | None:
    for name, entry in entries.items():  # missing files and sizes before any hash
        file = folder / name
        if not file.is_file():
            return Damage(file, f"is missing (it was written with the checkpoint, {entry['size']} bytes)")
        size = file.stat().st_size
        if size != int(entry["size"]):
            return Damage(
                file, f"is {size} bytes, but {entry['size']} were written (cut short or changed after the save)"
            )
    names = list(entries)
    for name, found in zip(names, _hash_all([folder / n for n in names]), strict=True):
        expected = str(entries[name]["sha256"])
        if found != expected:
            return Damage(
                folder / name,
                f"has changed since it was written: its sha256 is {found[:16]}..., "
                f"{expected[:16]}... when written (same size, other bytes)",
            )
    return None


# checkpoints


def checkpoint_damage(checkpoint: str | Path) -> Damage | None:
    """What is wrong with a checkpoint's files, or None when nothing is found."""
    from grpo_rl.model.loading import broken_model_file
    from grpo_rl.model.lora import ADAPTER_DIR

    checkpoint = Path(checkpoint)
    if has_manifest(checkpoint):
        return find_damage(checkpoint)
    # No manifest (written before manifests existed): whole files only, which finds a truncation, not changed bytes.
    for folder in (checkpoint / "model", checkpoint / ADAPTER_DIR):
        broken = broken_model_file(folder)
        if broken is not None:
            return Damage(*broken)
    state = checkpoint / "trainer_state.pt"
    problem = torch_file_problem(state) if state.is_file() else None
    return None if problem is None else Damage(state, problem)


def torch_file_problem(file: Path, *, read_all: bool = False) -> str | None:
    """Why ``file`` is not a whole ``torch.save`` file (a zip archive), or None; reads its first bytes and its zip
    directory (at the end), and with ``read_all`` every member, against its CRC-32."""
    try:
        with open(file, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return f"cannot be read ({type(e).__name__}: {e})"
    if head != b"PK\x03\x04":
        return "does not start as a torch file does (a zip archive)"
    if not zipfile.is_zipfile(file):
        return (
            f"is not a whole torch file ({file.stat().st_size} bytes without the zip directory that ends one: "
            "cut short?)"
        )
    if read_all:
        try:
            with zipfile.ZipFile(file) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            return f"cannot be read as a zip archive ({type(e).__name__}: {e})"
        if bad is not None:
            return f"holds a damaged member, {bad} (its CRC-32 does not match)"
    return None


_DAMAGED_FIX = (
    "Use another checkpoint (resume=auto, or the evaluation's checkpoint=<run dir>, takes the newest "
    "intact one of a run), or copy this one again from where it came from"
)


def verify_checkpoint(checkpoint: str | Path) -> None:
    """Raise :class:`CheckpointDamagedError` naming the file when :func:`checkpoint_damage` finds one; call before
    anything of the checkpoint is loaded."""
    damage = checkpoint_damage(checkpoint)
    if damage is not None:
        raise damaged(damage.file, damage.problem)


def load_error(file: Path, error: BaseException) -> CheckpointDamagedError:
    """The error of a checkpoint file that passed :func:`verify_checkpoint` (one without a manifest) and still does
    not load with ``error``: the file and the first sentence of the error."""
    reason = (str(error).strip().splitlines() or [""])[0].split(". ")[0][:200]
    return damaged(file, f"is damaged ({type(error).__name__}: {reason})")


def damaged(file: Path, problem: str) -> CheckpointDamagedError:
    """The error of a checkpoint whose ``file`` has ``problem`` (``is 1000 bytes, ...``), with the fix."""
    return CheckpointDamagedError(f"{file} {problem}, so the checkpoint cannot be loaded. {_DAMAGED_FIX}")


def damaged_file_error(folder: Path, error: Exception) -> CheckpointDamagedError | None:
    """The error naming the file of ``folder`` (a checkpoint's HF or adapter folder) that a failed load most likely
    failed on, or None when ``error`` is not about a damaged file (then it is a bug, and keeps its traceback)."""
    from safetensors import SafetensorError

    from grpo_rl.model.loading import broken_model_file

    broken = broken_model_file(folder)
    if broken is not None:
        return damaged(*broken)
    if not isinstance(error, (SafetensorError, OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError)):
        return None
    weights = sorted(folder.glob("*.safetensors"))
    return load_error(weights[0] if weights else folder, error)
