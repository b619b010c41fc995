"""The file transport's folder: a given folder others can write to is refused, files are private, unguessable and
never written through a planted symlink, the server reads only a regular file with the trainer's SHA-256, and
folders of killed runs are swept."""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load, save

from grpo_rl.engines import weight_folder
from grpo_rl.engines.served import ServedEngine
from grpo_rl.engines.weight_folder import RunFolder, check_weight_dir, read_weight_file, sweep_stale
from grpo_rl.errors import ConfigError
from tests.engine_stand_in import StandIn

DEAD_PID = 2**22 + 1  # above the kernel's PID_MAX_LIMIT: no process ever has it
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_given_folder_others_can_write_to_is_refused_before_any_server_is_contacted(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    for mode in (0o777, 0o770, 0o707):
        shared.chmod(mode)
        with pytest.raises(
            ConfigError,
            match=rf"inference_model.weight_dir={shared}: {shared} is writable by other "
            rf"users \(mode {mode:o}, no sticky bit\).*mkdir -m 700",
        ):
            check_weight_dir(str(shared))
    # nothing listens there: the folder is refused first
    with pytest.raises(ConfigError, match="writable by other users"):
        ServedEngine(["http://127.0.0.1:9"], key="k", pad_id=0, timeout=1, weight_dir=str(shared))
    shared.chmod(0o1777)  # sticky, like /tmp: others cannot rename or remove the run's folder
    assert check_weight_dir(str(shared)) == shared
    shared.chmod(0o755)
    assert check_weight_dir(str(shared)) == shared
    # a folder below one that others can write to could be swapped with its parent's entry
    inner = shared / "inner"
    inner.mkdir(mode=0o700)
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=f"{shared} is writable by other users"):
        check_weight_dir(str(inner))
    with pytest.raises(ConfigError, match="no such folder; create it with `mkdir -m 700"):
        check_weight_dir(str(tmp_path / "missing"))


@as_root
def test_a_given_folder_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 12345, -1)
    with pytest.raises(ConfigError, match=f"{theirs} belongs to uid 12345, not to you"):
        check_weight_dir(str(theirs))


def test_files_are_private_unguessable_and_never_written_through_a_planted_symlink(tmp_path, monkeypatch):
    folder = RunFolder(tmp_path)
    assert folder.path.parent == tmp_path and _mode(folder.path) == 0o700
    first, second = folder.write(b"one", "weights_v1"), folder.write(b"two", "weights_v1")
    assert first != second and first.startswith("weights_v1_") and len(first) == len("weights_v1_.safetensors") + 32
    assert _mode(folder.path / first) == 0o600 and (folder.path / first).read_bytes() == b"one"
    # a name known in advance (here: a predictable random source) holding a symlink is not followed
    monkeypatch.setattr(weight_folder.secrets, "token_hex", lambda n: "ab" * n)
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    (folder.path / f"weights_v2_{'ab' * 16}.safetensors").symlink_to(target)
    with pytest.raises(FileExistsError):
        folder.write(b"evil", "weights_v2")
    assert target.read_bytes() == b"keep"
    folder.close()
    assert not folder.path.exists() and target.exists()


def test_a_failed_write_leaves_no_partial_file(tmp_path):
    folder = RunFolder(tmp_path)
    with pytest.raises(TypeError):
        folder.write(object(), "weights_v1")  # fails after the file was created
    assert sorted(p.name for p in folder.path.iterdir()) == [weight_folder.LOCK]
    folder.close()


def test_the_server_reads_only_a_regular_file_with_the_trainers_hash(tmp_path):
    data = b"weights"
    digest = hashlib.sha256(data).hexdigest()
    (tmp_path / "w").write_bytes(data)
    assert read_weight_file(tmp_path, "w", digest) == data
    with pytest.raises(
        ValueError,
        match=f"weight file {tmp_path / 'w'} has SHA-256 .* but the trainer wrote "
        f"{'0' * 64}: it was changed after it was written; refused",
    ):
        read_weight_file(tmp_path, "w", "0" * 64)
    (tmp_path / "link").symlink_to(tmp_path / "w")
    with pytest.raises(ValueError, match="is a symbolic link; refused"):
        read_weight_file(tmp_path, "link", digest)
    os.mkfifo(tmp_path / "fifo")  # would block an open without O_NONBLOCK
    with pytest.raises(ValueError, match="is not a regular file; refused"):
        read_weight_file(tmp_path, "fifo", digest)
    for name in ("../w", "sub/w", ".."):
        with pytest.raises(ValueError, match="is not in the weight folder"):
            read_weight_file(tmp_path / "sub", name, digest)


@pytest.mark.slow
def test_receive_weights_refuses_a_changed_file_and_loads_a_good_one(tmp_path):
    from grpo_rl.engines.file_transfer import FileInitInfo, FileUpdateInfo, SharedFileWeightTransfer

    class Model:
        loaded = []

        def load_weights(self, named):
            self.loaded.extend(named)

    model = Model()
    transfer = SharedFileWeightTransfer(
        None, SimpleNamespace(parallel_config=None, model_config=None), torch.device("cpu"), model
    )
    transfer.init_transfer_engine(FileInitInfo(directory=str(tmp_path)))
    data = save({"w": torch.arange(3.0)})
    (tmp_path / "f.safetensors").write_bytes(data)
    good = hashlib.sha256(data).hexdigest()
    with pytest.raises(ValueError, match="has SHA-256 .* refused"):
        transfer.receive_weights(FileUpdateInfo(file="f.safetensors", num_tensors=1, sha256="1" * 64))
    assert model.loaded == []
    transfer.receive_weights(
        FileUpdateInfo(file="f.safetensors", num_tensors=1, sha256=good, aliases={"lm_head.weight": "w"})
    )
    assert [(k, v.tolist()) for k, v in model.loaded] == [("w", [0.0, 1.0, 2.0]), ("lm_head.weight", [0.0, 1.0, 2.0])]


def _debris(parent: Path, pid: int, host: str | None = None, lock: bool = False) -> Path:
    folder = parent / f"{weight_folder.PREFIX}{pid}@{host or weight_folder._host()}-x{len(list(parent.iterdir()))}"
    folder.mkdir(mode=0o700)
    (folder / "weights_v3_ab.safetensors").write_bytes(b"x")
    if lock:
        (folder / weight_folder.LOCK).touch()
    return folder


def test_folders_of_killed_runs_are_swept_and_nothing_else(tmp_path):
    dead = _debris(tmp_path, DEAD_PID)
    dead_unlocked = _debris(tmp_path, DEAD_PID, lock=True)  # its creator's lock went with it
    alive = _debris(tmp_path, os.getpid())
    other_host = _debris(tmp_path, DEAD_PID, host="elsewhere")
    # a live run in another pid namespace (a container sharing /dev/shm): its pid looks dead here, its lock is held
    held = _debris(tmp_path, DEAD_PID, lock=True)
    fd = os.open(held / weight_folder.LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    # a symlink named like debris is not followed into its target
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_bytes(b"k")
    link = tmp_path / f"{weight_folder.PREFIX}{DEAD_PID}@{weight_folder._host()}-link"
    link.symlink_to(target)
    assert sorted(sweep_stale(tmp_path)) == sorted([dead, dead_unlocked])
    assert not dead.exists() and not dead_unlocked.exists()
    assert alive.exists() and other_host.exists() and held.exists() and (target / "keep").exists() and link.is_symlink()
    os.close(fd)
    # a new run's folder sweeps first; its own folder is locked while it lives, so the next one keeps it
    folder = RunFolder(tmp_path)
    assert not held.exists()
    assert RunFolder(tmp_path).path.exists() and folder.path.exists()
    folder.close()


@as_root
def test_another_users_debris_is_left_alone(tmp_path):
    theirs = _debris(tmp_path, DEAD_PID)
    os.chown(theirs, 12345, -1)
    assert sweep_stale(tmp_path) == [] and theirs.exists()


class ReadingStandIn(StandIn):
    """A stand-in server that reads each pushed file as the server's transport does, and notes the file's mode."""

    def route(self, path: str, body: dict) -> dict:
        if path == "/init_weight_transfer_engine":
            self.folder = Path(body["init_info"]["directory"])
        if path == "/update_weights":
            info = body["update_info"]
            self.file_mode = _mode(self.folder / info["file"])
            self.received = load(read_weight_file(self.folder, info["file"], info["sha256"]))
        return super().route(path, body)


def test_a_push_goes_through_a_private_folder_inside_the_given_one(tmp_path):
    server = ReadingStandIn()
    engine = ServedEngine([server.url], key="k", pad_id=0, timeout=10, weight_dir=str(tmp_path))
    engine.update_weights([("w", torch.arange(2.0))], 1)
    folder = server.folder
    assert folder.parent == tmp_path and folder.name.startswith(f"grpo_rl_weights_{os.getpid()}@")
    assert _mode(folder) == 0o700 and server.file_mode == 0o600
    assert server.received["w"].tolist() == [0.0, 1.0]  # read with the trainer's SHA-256
    assert [p.name for p in folder.iterdir()] == [weight_folder.LOCK]  # the file went after the load
    engine.shutdown()
    assert not folder.exists() and tmp_path.exists()
    server.close()


def test_the_default_folder_is_private_and_removed_at_shutdown():
    server = ReadingStandIn()
    engine = ServedEngine([server.url], key="k", pad_id=0, timeout=10)
    engine.update_weights([("w", torch.ones(2))], 1)
    folder = server.folder
    assert folder.parent == weight_folder.default_parent() and _mode(folder) == 0o700
    engine.shutdown()
    assert not folder.exists()
    server.close()
