"""A checkpoint's temporary folder gets the permissions the user's umask gives, read without ever setting the
umask: the umask is process-wide, and ``umask(0)`` even for an instant would make files that other threads create
meanwhile writable by everyone."""

from __future__ import annotations

import os
import stat

import pytest

from grpo_rl.run import atomic_fs


@pytest.fixture
def umask_untouchable(monkeypatch):
    def refuse(mask):
        raise AssertionError(f"os.umask({mask:o}) called while the run's threads may create files")

    monkeypatch.setattr(os, "umask", refuse)


@pytest.fixture
def actual_umask() -> int:
    umask = os.umask(0o022)  # the test's own thread, before the fixture that forbids it
    os.umask(umask)
    return umask


def test_the_umask_is_read_without_being_changed(actual_umask, umask_untouchable):
    assert atomic_fs._process_umask() == actual_umask  # from /proc/self/status


def test_a_temporary_folder_gets_the_umasks_permissions(tmp_path, monkeypatch, umask_untouchable):
    monkeypatch.setattr(atomic_fs, "_UMASK", 0o027)
    tmp = atomic_fs.make_tmp(tmp_path, "step_00000001")
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o750  # not mkdtemp's 0700, and nothing the umask forbids
