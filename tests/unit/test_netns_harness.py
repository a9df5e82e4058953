"""The network-namespace harness (tests/netns.py): test hosts reach each other and the root
namespace, a cut link carries nothing until restored, and nothing of ours outlives the run.
Needs root and iproute2; skipped (with the reason) where namespaces cannot be made."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests import netns

REASON = netns.available()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")

# A TCP server: binds argv[1], prints its port, answers each connection with "<argv[2]> <peer ip>".
SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    c, peer = s.accept()
    c.sendall(f"{sys.argv[2]} {peer[0]}\\n".encode())
    c.close()
"""

# A TCP client: connects to argv[1]:argv[2] within argv[3] seconds, prints the server's line.
CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
    c.settimeout(float(sys.argv[3]))
    print(c.makefile().readline().strip())
"""


def start_server(net: netns.Network, i: int) -> int:
    proc = net.popen(i, [sys.executable, "-c", SERVER, net.hosts[i].address, net.hosts[i].name],
                     stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    assert ready, f"the server in {net.hosts[i].netns} printed no port within 10 s"
    return int(proc.stdout.readline())


def ask_from_root(address: str, port: int, timeout: float = 1.0) -> str:
    with socket.create_connection((address, port), timeout=timeout) as conn:
        conn.settimeout(timeout)
        return conn.makefile().readline().strip()


def ask_from_host(net: netns.Network, i: int, address: str, port: int, timeout: float = 1.0) -> subprocess.CompletedProcess:
    return subprocess.run(net.command(i, [sys.executable, "-c", CLIENT, address, str(port), str(timeout)]),
                          capture_output=True, text=True, timeout=timeout + 10)


def present_names() -> str:
    netns_list = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return netns_list + links


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's reaper may take its time)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return False


def test_available_agrees_with_a_direct_probe():
    """available() says None exactly when `ip netns add` works here (checked independently)."""
    name = f"funke-probe-{uuid.uuid4().hex[:8]}"
    can = os.geteuid() == 0 and subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    if can:
        subprocess.run(["ip", "netns", "delete", name], check=True)
    reason = netns.available()
    if can:
        assert reason is None
    else:
        assert isinstance(reason, str) and reason


@needs_netns
def test_hosts_reach_each_other_a_cut_host_reaches_no_one_until_restored():
    started = time.monotonic()
    with netns.Network(hosts=2) as net:
        names = net.names()
        assert len(set(names)) == 5 and all(len(n) <= 15 for n in names[:3])
        assert net.root_address not in {h.address for h in net.hosts}
        for name in names:
            assert name in present_names()
        port0, port1 = start_server(net, 0), start_server(net, 1)
        servers = list(net._tracked)

        # root namespace -> host 0: the server sees the bridge address as the peer
        assert ask_from_root(net.hosts[0].address, port0) == f"h0 {net.root_address}"
        # host 1 -> host 0 through the bridge: the peer is host 1's own address
        reply = ask_from_host(net, 1, net.hosts[0].address, port0)
        assert reply.returncode == 0, reply.stderr
        assert reply.stdout.strip() == f"h0 {net.hosts[1].address}"
        # host 0's server is bound to host 0's address only: not there in host 1
        wrong = ask_from_host(net, 1, net.hosts[1].address, port0)
        assert wrong.returncode != 0 or wrong.stdout.strip() != f"h0 {net.hosts[1].address}"

        net.cut(0)
        with pytest.raises(OSError):
            ask_from_root(net.hosts[0].address, port0, timeout=1.0)
        assert ask_from_host(net, 1, net.hosts[0].address, port0, timeout=1.0).returncode != 0
        assert ask_from_host(net, 0, net.hosts[1].address, port1, timeout=1.0).returncode != 0
        assert ask_from_root(net.hosts[1].address, port1) == f"h1 {net.root_address}"

        net.restore(0)
        assert ask_from_root(net.hosts[0].address, port0) == f"h0 {net.root_address}"
        reply = ask_from_host(net, 1, net.hosts[0].address, port0)
        assert reply.stdout.strip() == f"h0 {net.hosts[1].address}", reply.stderr
        assert all(t.process.poll() is None for t in servers)

    assert all(t.process.poll() is not None for t in servers), "tracked servers outlived the network"
    left = present_names()
    assert [n for n in names if n in left] == []
    assert time.monotonic() - started < 15


@needs_netns
def test_clean_up_after_an_exception_kills_the_tracked_process_group():
    with pytest.raises(RuntimeError, match="boom"):
        with netns.Network(hosts=1) as net:
            names = net.names()
            # a shell with a child in its group; the shell prints the child's pid
            shell = net.popen(0, ["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
            child = int(shell.stdout.readline())
            os.kill(child, 0)
            raise RuntimeError("boom")
    assert shell.poll() is not None
    deadline = time.monotonic() + 5
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running(child), "the tracked shell's child outlived the network"
    left = present_names()
    assert [n for n in names if n in left] == []


@needs_netns
def test_hosts_have_no_route_off_the_test_network():
    with netns.Network(hosts=1) as net:
        ns = net.hosts[0].netns
        routes = subprocess.run(["ip", "-n", ns, "route"], capture_output=True, text=True, check=True).stdout
        assert "default" not in routes
        off = subprocess.run(["ip", "-n", ns, "route", "get", "203.0.113.7"], capture_output=True, text=True)
        assert off.returncode != 0 and "unreachable" in off.stderr.lower()
        assert subprocess.run(["ip", "-n", ns, "route", "get", net.root_address],
                              capture_output=True, check=False).returncode == 0


@needs_netns
def test_sweep_removes_a_dead_runs_leftovers_and_spares_a_live_network():
    dead = subprocess.Popen(["true"])
    dead.wait()
    suffix = f"{dead.pid}zzq"
    ns, bridge, veth = f"funke-{suffix}-h0", f"fkb{suffix}", f"fkv{suffix}0"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "link", "add", "name", bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "add", "name", veth, "type", "veth", "peer", "name", "eth0", "netns", ns], check=True)
        subprocess.run(["ip", "link", "set", "dev", veth, "master", bridge], check=True)
        with netns.Network(hosts=1) as live:  # sweeps on start
            assert all(n not in present_names() for n in (ns, bridge, veth))
            assert netns.sweep_leftovers() == []
            assert all(n in present_names() for n in live.names())
            assert netns.reachable(live.hosts[0].address)
    finally:
        subprocess.run(["ip", "link", "delete", veth], capture_output=True)
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
