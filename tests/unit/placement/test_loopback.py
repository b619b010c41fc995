"""On one machine the run listens on loopback only: the rendezvous store, gloo's connections, Ray's local instance.

The host name of a test machine often resolves to 127.0.0.1, where gloo's default would pass by luck; naming a
non-loopback interface in ``GLOO_SOCKET_IFNAME`` makes that default bind beyond loopback, so the checks can fail.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from grpo_rl.placement.ray import LOOPBACK, address_towards, host_store, interface_with_address, node_address
from grpo_rl.weights.collective import WeightBroadcast
from tests.sockets import listening_of, non_loopback_ipv4, pids_with_env, socket_inodes

CPU = torch.device("cpu")


def _listening_here(since: set[int]) -> list:
    """This process's listening sockets opened after ``since`` (a set of socket inodes)."""
    return [s for s in listening_of([os.getpid()])[os.getpid()] if s.inode not in since]


def test_host_store_listens_on_its_address_only():
    before = socket_inodes(os.getpid())
    store = host_store(LOOPBACK, 5.0)
    assert [str(s) for s in _listening_here(before)] == [f"tcp {LOOPBACK}:{store.port}"]  # torch alone binds *:port
    client = dist.TCPStore(LOOPBACK, store.port, None, False, timedelta(seconds=5))
    client.set("key", "value")
    assert store.get("key") == b"value"
    with socket.socket() as squatter, pytest.raises(OSError):  # the port was never free once chosen
        squatter.bind((LOOPBACK, store.port))


def test_route_and_interface_of_an_address():
    assert address_towards(LOOPBACK) == LOOPBACK and interface_with_address(LOOPBACK) == "lo"
    other = non_loopback_ipv4()
    if other is not None:
        name, address = other
        assert address_towards(address) == address and interface_with_address(address) == name
    with pytest.raises(RuntimeError, match="198.51.100.254"):  # a documentation address (TEST-NET-2)
        interface_with_address("198.51.100.254")


def test_weight_broadcast_listens_on_loopback_whatever_gloo_is_told(monkeypatch):
    other = non_loopback_ipv4()
    if other is None:
        pytest.skip("no non-loopback IPv4 interface to tempt gloo's default device with")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", other[0])
    before = socket_inodes(os.getpid())
    store = host_store(LOOPBACK, 20.0)
    joined, received, errors = threading.Event(), [], []

    def receive() -> None:
        try:
            receiver = WeightBroadcast.connect(LOOPBACK, store.port, 1, 2, CPU, timeout_seconds=20)
            joined.set()
            received.append(receiver.receive())
            receiver.close()
        except Exception as e:  # reported to the main thread
            errors.append(e)
            joined.set()

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    sender = WeightBroadcast.connect(LOOPBACK, store.port, 0, 2, CPU, timeout_seconds=20, store=store)
    joined.wait(timeout=20)
    listening = _listening_here(before)
    sender.send([("w", torch.arange(3.0))], version=1)
    thread.join(timeout=20)
    sender.close()
    assert not errors, errors
    assert len(listening) >= 2, listening  # the store and gloo's own listener(s)
    assert [str(s) for s in listening if not s.loopback] == []
    assert received[0][0] == 1 and torch.equal(dict(received[0][1])["w"], torch.arange(3.0))


@pytest.fixture
def peer_namespace():
    """A network namespace joined to this one by a veth pair: a peer on another machine, as far as sockets go.
    Yields ``(namespace, this side's address)``; skips where namespaces cannot be made (no root, no ``ip``)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("creating a network namespace needs root and iproute2's ip")
    tag = f"{os.getpid() % 100000}{random.randrange(100)}"
    ns, here, there = f"grpolb{tag}", f"glb{tag}a", f"glb{tag}b"  # link names take at most 15 characters
    subnet = f"10.{random.randrange(200, 250)}.{random.randrange(256)}"
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
        ["ip", "link", "set", there, "netns", ns],
        ["ip", "addr", "add", f"{subnet}.1/30", "dev", here],
        ["ip", "link", "set", here, "up"],
        ["ip", "-n", ns, "addr", "add", f"{subnet}.2/30", "dev", there],
        ["ip", "-n", ns, "link", "set", there, "up"],
    ]
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=20)
            if done.returncode:
                pytest.skip(f"cannot build a network namespace here ({' '.join(step)}: {done.stderr.strip()})")
        yield ns, f"{subnet}.1"
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=20)  # its peer goes with it
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def _reaches(ns: str, address: str, port: int) -> bool:
    probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout=3).close()"
    return (
        subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", probe], capture_output=True, timeout=30
        ).returncode
        == 0
    )


def test_rendezvous_is_out_of_reach_of_another_host(peer_namespace):
    """The peer reaches a socket that listens on every interface (the probe works) but not the rendezvous store."""
    ns, address = peer_namespace
    store = host_store(LOOPBACK, 5.0)
    with socket.socket() as exposed:
        exposed.bind(("0.0.0.0", 0))
        exposed.listen()
        assert _reaches(ns, address, exposed.getsockname()[1])
        assert not _reaches(ns, address, store.port)


@pytest.mark.slow
def test_local_ray_instance_and_its_rendezvous_listen_on_loopback(monkeypatch):
    """A local Ray instance takes the node address 127.0.0.1 (so do its actors), every Ray process listens on
    loopback only, and the weight broadcast it hosts for an actor meets there; the driver's process settings that
    made it so are back as they were."""
    from omegaconf import OmegaConf

    ray = pytest.importorskip("ray")
    from ray._private import ray_constants

    from grpo_rl.config.schema import RayConfig
    from grpo_rl.placement.ray import start_ray, stop_ray
    from grpo_rl.weights.collective_sync import CollectiveWeightSync

    if ray.is_initialized():
        pytest.skip("Ray is already running in this process")
    marker = uuid.uuid4().hex
    monkeypatch.setenv("GRPO_LOOPBACK_TEST", marker)  # Ray's processes inherit it: that is how they are found
    tag = f"GRPO_LOOPBACK_TEST={marker}"
    flag = ray_constants.ENABLE_RAY_CLUSTER
    secret = f"GRPO_WITHHELD={uuid.uuid4().hex}"
    monkeypatch.setenv("GRPO_WITHHELD", secret.split("=")[1])  # a key only some actors may get
    # another Ray instance in view (as a `ray start` cluster of this machine would be): the run still starts its own
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    started = start_ray(OmegaConf.structured(RayConfig(num_cpus=1)), withhold=("GRPO_WITHHELD",))
    try:
        assert started and node_address() == LOOPBACK
        assert os.environ["GRPO_WITHHELD"] == secret.split("=")[1]  # this process keeps it
        ray_pids = [p for p in pids_with_env(tag) if p != os.getpid()]
        assert ray_pids and not [p for p in ray_pids if p in pids_with_env(secret)]  # Ray's processes never had it
        assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ and ray_constants.ENABLE_RAY_CLUSTER == flag

        @ray.remote(num_cpus=0)
        class Receiver:  # a collector's side of the weight broadcast
            def connect_collective(self, address: str, port: int, world_size: int) -> str:
                self.member = WeightBroadcast.connect(address, port, 1, world_size, CPU, 60)
                return address

            def receive_weights(self) -> None:
                self.received = dict(self.member.receive()[1])["w"].tolist()

            def last_received(self) -> list[float]:
                return self.received

            def node(self) -> str:
                return ray.util.get_node_ip_address()

        receiver = Receiver.remote()
        assert ray.get(receiver.node.remote(), timeout=120) == LOOPBACK
        sync = CollectiveWeightSync([receiver], device=CPU, timeout=60)
        try:
            sync.push([("w", torch.arange(2.0))], version=1)
            assert ray.get(receiver.last_received.remote(), timeout=60) == [0.0, 1.0]
            processes = listening_of(pids_with_env(tag))
            assert len([p for p, socks in processes.items() if socks]) >= 3  # GCS, raylet, this driver, the actor...
            beyond = {p: [str(s) for s in socks if not s.loopback] for p, socks in processes.items()}
            assert {p: s for p, s in beyond.items() if s} == {}
        finally:
            sync.close()
    finally:
        stop_ray(started)


TIMED_OUT = "The current node timed out during startup. This could happen because some of the raylet failed to startup"


def test_a_ray_start_that_timed_out_is_stopped_and_started_again(caplog):
    """Ray's node start that overran Ray's fixed wait (a busy machine) leaves processes behind: they are stopped,
    and the start is tried again; any other failure, or the last attempt's, is raised as it is."""
    from grpo_rl.placement.ray import _init_with_retries

    left: list[subprocess.Popen] = []

    def slow_then_fine():
        if not left:
            left.append(subprocess.Popen(["sleep", "120"]))  # what the failed start left running
            raise Exception(TIMED_OUT)

    with caplog.at_level("WARNING", logger="grpo_rl.placement.ray"):
        _init_with_retries(slow_then_fine)
    assert left[0].wait(timeout=10) is not None  # stopped before the second start
    assert "starting it again, 2 of 3" in caplog.text

    calls = []

    def always_slow():
        calls.append(1)
        raise Exception(TIMED_OUT)

    with pytest.raises(Exception, match="timed out during startup"):
        _init_with_retries(always_slow, attempts=2)
    assert len(calls) == 2

    def broken():
        calls.append(1)
        raise ValueError("num_cpus must not be provided")

    calls.clear()
    with pytest.raises(ValueError):
        _init_with_retries(broken)
    assert len(calls) == 1
