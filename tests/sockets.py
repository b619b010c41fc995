"""Which sockets a set of processes listens on, read from /proc (Linux; no ``ss`` needed).

A TCP socket listens in state LISTEN; a UDP socket "listens" when it is bound and not connected (it takes datagrams
from anyone). :attr:`Listening.loopback` tells those whose local address is 127.0.0.0/8, ::1 or ::ffff:127.x.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

_TCP_LISTEN, _UDP_UNCONNECTED = "0A", "07"


@dataclass(frozen=True)
class Listening:
    protocol: str  # tcp, tcp6, udp, udp6
    address: str
    port: int
    inode: int

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        mapped = getattr(ip, "ipv4_mapped", None)
        return ip.is_loopback or bool(mapped and mapped.is_loopback)

    def __str__(self) -> str:
        return f"{self.protocol} {self.address}:{self.port}"


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # /proc prints an IPv6 address as four 32-bit words, each in host (little-endian) order
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def listening_sockets() -> dict[int, Listening]:
    """Every listening socket of this network namespace, by inode."""
    found: dict[int, Listening] = {}
    for protocol in ("tcp", "tcp6", "udp", "udp6"):
        path = Path("/proc/net") / protocol
        if not path.exists():
            continue
        for row in path.read_text().splitlines()[1:]:
            fields = row.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
            remote_port = int(remote.rsplit(":", 1)[1], 16)
            if state == _TCP_LISTEN or (protocol.startswith("udp") and state == _UDP_UNCONNECTED and remote_port == 0):
                hex_address, hex_port = local.rsplit(":", 1)
                found[inode] = Listening(protocol, _address(hex_address), int(hex_port, 16), inode)
    return found


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets ``pid`` holds open (empty if it is gone)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def pids_with_env(tag: str) -> list[int]:
    """Live processes whose environment contains ``tag`` (a run's processes, Ray's included, inherit it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if tag.encode() in Path(f"/proc/{entry}/environ").read_bytes():
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def listening_of(pids: list[int]) -> dict[int, list[Listening]]:
    """The listening sockets each of ``pids`` holds."""
    table = listening_sockets()
    return {pid: [table[i] for i in socket_inodes(pid) if i in table] for pid in pids}


def non_loopback_ipv4() -> tuple[str, str] | None:
    """An interface of this machine with an IPv4 address that is not loopback, as ``(name, address)``."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR
                ifreq = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            address = socket.inet_ntoa(ifreq[20:24])
            if not ipaddress.ip_address(address).is_loopback:
                return name, address
    return None
