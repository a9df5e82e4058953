"""Test hosts of their own: network namespaces on a private bridge, for tests that run funke
processes "on other machines" and cut one machine's link (longer than a heartbeat timeout) and
restore it.

    from tests import netns

    if (reason := netns.available()) is not None:
        pytest.skip(reason)
    with netns.Network(hosts=2) as net:
        jm = subprocess.Popen([... "--host", net.root_address ...])          # root namespace
        tm = net.popen(0, [sys.executable, "-m", ..., "--host", net.hosts[0].address,
                            "--jobmanager", f"{net.root_address}:{port}"])      # killed on exit
        net.cut(0)        # host 0 can reach no one, no one can reach host 0
        net.restore(0)    # back, and usable (checked) before it returns

Layout (all of it created here, all of it removed on exit, also after an exception):

- a bridge `fkb<suffix>` in the root namespace holding `root_address` (x.y.z.1/24), so a
  process in the root namespace that binds `root_address` is reachable from every host;
- per host i a namespace `funke-<suffix>-h<i>` with `lo` up and `eth0` = x.y.z.(10+i)/24, the
  other end of its veth pair (`fkv<suffix><i>`) a port of the bridge;
- `<suffix>` is the creating PID followed by three random letters, so parallel runs never
  collide and `sweep_leftovers()` can tell a dead run's junk from a live run's hosts.

The /24 is picked from the benchmark range 198.18.0.0/15 (RFC 2544, never on a real network),
at random among those that overlap no address, no route (any table) and no name server of the
machine, under a lock file so two runs starting together do not pick the same one.

Nothing leaves the machine: a host namespace has a route to its /24 and host routes (/32) to
the root namespace's own IPv4 addresses, and no default route, so a connect to anything else
fails at once with "Network is unreachable" (with a default route and a machine that forwards,
ip_forward=1, the packets would go out of its real interface). No sysctl is changed; IPv6 is
kept off our links (addrgenmode none: no link-local addresses, no router solicitations).

Names do not resolve to test hosts: the namespaces share the machine's /etc/hosts, resolv.conf
and hostname (`ip netns exec` makes no UTS namespace), so `socket.gethostname()` in a host is the
machine's name and a name server is unreachable from it. Tests pass IP addresses, never
hostnames: bind and advertise `net.hosts[i].address` (a TaskManager bound to 0.0.0.0 advertises
socket.gethostname(), which names the machine, not the test host).

The harness kills only processes handed to it (`track`, `popen`), by PID: SIGTERM to the process
group when the process leads its own group (else to the process alone), SIGKILL after a grace
period, before the namespaces go.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import os
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

POOL = ipaddress.ip_network("198.18.0.0/15")
NETNS_PREFIX = "funke-"
_NS_RE = re.compile(r"^funke-(?P<pid>\d+)(?P<tag>[a-z]{3})-(?:h\d+|probe)$")
_LINK_RE = re.compile(r"^fk[bv](?P<pid>\d+)(?P<tag>[a-z]{3})\d*$")
_LOCK = Path("/run/funke-netns.lock") if Path("/run").is_dir() else Path("/tmp/funke-netns.lock")
MAX_HOSTS = 99          # fkv + 7-digit pid + 3 letters + 2 digits = 15 characters, the limit
HOST_OFFSET = 10        # host i has x.y.z.(10+i)
_PROBE_PORT = 9         # restore(): a connect answered, even refused, proves the link works


class NetnsError(RuntimeError):
    pass


def _ip_binary() -> str | None:
    return shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip")
                                       if os.access(p, os.X_OK)), None)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    binary = _ip_binary()
    if binary is None:
        raise NetnsError("the `ip` binary (iproute2) is not installed")
    result = subprocess.run([binary, *args], capture_output=True, text=True, timeout=30,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def _new_suffix() -> str:
    return f"{os.getpid()}{''.join(random.choices(string.ascii_lowercase, k=3))}"


def available() -> str | None:
    """None when network namespaces, veth pairs and bridges can be made here, else why not.
    Probes by making a throwaway namespace (a veth pair and a bridge inside it, so the root
    namespace sees nothing) and deleting it."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if _ip_binary() is None:
        return "the `ip` binary (iproute2) is not installed"
    if os.geteuid() != 0:
        return f"network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN); euid is {os.geteuid()}"
    name = f"{NETNS_PREFIX}{_new_suffix()}-probe"
    added = _ip("netns", "add", name, check=False)
    if added.returncode != 0:
        return f"`ip netns add` was refused (an unprivileged container?): {added.stderr.strip()}"
    try:
        for args, what in ((("link", "add", "a0", "type", "veth", "peer", "name", "a1"), "a veth pair"),
                           (("link", "add", "b0", "type", "bridge"), "a bridge")):
            made = _ip("-n", name, *args, check=False)
            if made.returncode != 0:
                return f"cannot create {what} in a namespace: {made.stderr.strip()}"
    finally:
        deleted = _ip("netns", "delete", name, check=False)
    if deleted.returncode != 0:
        return f"`ip netns delete` failed: {deleted.stderr.strip()}"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _our_namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip() and _NS_RE.match(line.split()[0])]


def _our_links() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@")[0]
            if _LINK_RE.match(name):
                names.append(name)
    return names


def sweep_leftovers() -> list[str]:
    """Delete the namespaces, veths and bridges of ours (by name) whose creating PID no longer
    runs: what a killed test run left behind. Kills nothing; a process still inside a deleted
    namespace keeps it alive until it exits (its PIDs are named in the returned list). Returns
    what was removed.

    Caveat: a run in another PID namespace sharing this network namespace would look dead."""
    removed = []
    links = _our_links()
    # veths first (a veth goes with its peer), then bridges, then namespaces
    for name in sorted(links, key=lambda n: n.startswith("fkb")):
        if not _pid_alive(int(_LINK_RE.match(name)["pid"])):
            if _ip("link", "delete", name, check=False).returncode == 0:
                removed.append(f"link {name}")
    for ns in _our_namespaces():
        if not _pid_alive(int(_NS_RE.match(ns)["pid"])):
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            if _ip("netns", "delete", ns, check=False).returncode == 0:
                removed.append(f"netns {ns}" + (f" (processes still inside: {' '.join(pids)})" if pids else ""))
    return removed


def _root_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace knows of: its addresses, routes in all tables (but
    the default route) and the name servers of /etc/resolv.conf."""
    nets: list[ipaddress.IPv4Network] = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        tokens = line.split()
        if "inet" in tokens:
            nets.append(ipaddress.ip_network(tokens[tokens.index("inet") + 1], strict=False))
    route_types = {"unicast", "local", "broadcast", "multicast", "throw", "unreachable", "prohibit",
                   "blackhole", "nat", "anycast"}
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        tokens = line.split()
        if not tokens:
            continue
        dest = tokens[1] if tokens[0] in route_types and len(tokens) > 1 else tokens[0]
        if dest == "default":
            continue
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(dest, strict=False))
    with contextlib.suppress(OSError):
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            tokens = line.split()
            if len(tokens) >= 2 and tokens[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    address = ipaddress.ip_address(tokens[1])
                    if address.version == 4:
                        nets.append(ipaddress.ip_network(f"{address}/32"))
    return nets


def _pick_subnet() -> ipaddress.IPv4Network:
    taken = _root_networks()
    candidates = list(POOL.subnets(new_prefix=24))
    random.shuffle(candidates)
    for subnet in candidates:
        if not any(subnet.overlaps(net) for net in taken):
            return subnet
    raise NetnsError(f"every /24 of {POOL} overlaps an address or route of this machine")


def _local_ipv4_addresses() -> list[str]:
    out = _ip("-4", "-o", "addr", "show").stdout
    addresses = []
    for line in out.splitlines():
        tokens = line.split()
        if "inet" in tokens:
            address = ipaddress.ip_interface(tokens[tokens.index("inet") + 1]).ip
            if not address.is_loopback:
                addresses.append(str(address))
    return addresses


def reachable(address: str, port: int = _PROBE_PORT, timeout: float = 1.0) -> bool:
    """Whether address answers a TCP connect within timeout from this namespace: accepted or
    refused both prove the link carries packets both ways."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def _group_has_live_members(pgid: int) -> bool:
    """Whether a process other than a zombie is in process group pgid (an orphaned child's
    zombie stays in the group until init reaps it, which may take a second or more)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    state, _ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
            except (OSError, ValueError):
                continue
            if int(pgrp) == pgid and state not in ("Z", "X"):
                return True
    return False


@dataclass
class Host:
    index: int
    name: str          # h<i>: a label for ids and logs, not resolvable
    address: str       # eth0's IPv4 address inside the namespace
    netns: str         # funke-<suffix>-h<i>
    veth: str          # the bridge-side end in the root namespace (what cut() takes down)


@dataclass
class _Tracked:
    process: subprocess.Popen
    leads_group: bool


class Network:
    """A bridge in the root namespace and `hosts` namespaces on it; see the module doc.

    Attributes once started: root_address (the bridge's IPv4 address), hosts (list of Host),
    subnet (the /24), suffix, bridge (its interface name)."""

    def __init__(self, hosts: int = 2, grace: float = 5.0):
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be 1..{MAX_HOSTS}, not {hosts}")
        self.hosts_wanted = hosts
        self.grace = grace
        self.hosts: list[Host] = []
        self.root_address = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self.suffix = ""
        self.bridge = ""
        self._tracked: list[_Tracked] = []
        self._started = False

    # ---- life cycle

    def __enter__(self) -> Network:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except NetnsError as problem:
            if exc is None:
                raise
            exc.add_note(str(problem))  # do not hide the test's own failure behind ours

    def start(self) -> Network:
        if self._started:
            raise NetnsError("this Network is already started")
        reason = available()
        if reason is not None:
            raise NetnsError(reason)
        sweep_leftovers()
        self._started = True
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        existing_links = set(_our_links())
        existing_ns = set(_our_namespaces())
        _LOCK.touch(exist_ok=True)
        with open(_LOCK) as lock:
            # the pick and the bridge's address (which makes its route visible) under one lock
            fcntl.flock(lock, fcntl.LOCK_EX)
            while True:
                self.suffix = _new_suffix()
                if f"fkb{self.suffix}" not in existing_links and not any(
                        ns.startswith(f"{NETNS_PREFIX}{self.suffix}-") for ns in existing_ns):
                    break
            self.bridge = f"fkb{self.suffix}"
            self.subnet = _pick_subnet()
            self.root_address = str(self.subnet.network_address + 1)
            mac = "02:" + ":".join(f"{random.randrange(256):02x}" for _ in range(5))
            _ip("link", "add", "name", self.bridge, "address", mac, "type", "bridge",
                "stp_state", "0", "forward_delay", "0")
            _ip("link", "set", "dev", self.bridge, "addrgenmode", "none")
            _ip("addr", "add", f"{self.root_address}/24", "dev", self.bridge)
            _ip("link", "set", "dev", self.bridge, "up")
        root_addresses = _local_ipv4_addresses()
        for i in range(self.hosts_wanted):
            host = Host(index=i, name=f"h{i}", address=str(self.subnet.network_address + HOST_OFFSET + i),
                        netns=f"{NETNS_PREFIX}{self.suffix}-h{i}", veth=f"fkv{self.suffix}{i}")
            self.hosts.append(host)
            _ip("netns", "add", host.netns)
            _ip("-n", host.netns, "link", "set", "dev", "lo", "up")
            _ip("link", "add", "name", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            _ip("link", "set", "dev", host.veth, "addrgenmode", "none")
            _ip("link", "set", "dev", host.veth, "master", self.bridge)
            _ip("link", "set", "dev", host.veth, "up")
            _ip("-n", host.netns, "link", "set", "dev", "eth0", "addrgenmode", "none")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "dev", "eth0", "up")
            for address in root_addresses:
                if address != self.root_address and ipaddress.ip_address(address) not in self.subnet:
                    _ip("-n", host.netns, "route", "add", f"{address}/32", "via", self.root_address)
        for host in self.hosts:
            self._wait_usable(host, 10.0)

    def close(self) -> None:
        """Kill the tracked processes, then delete the veths, namespaces and bridge. Idempotent;
        raises (after doing all it can) when something of ours could not be removed."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        problems = []
        try:
            self._kill_tracked()
        except Exception as exc:  # still remove the network
            problems.append(f"killing tracked processes: {exc}")
        present_links = set(_our_links())
        present_ns = set(_our_namespaces())
        for host in self.hosts:
            if host.veth in present_links:
                result = _ip("link", "delete", host.veth, check=False)
                if result.returncode != 0:
                    problems.append(f"link {host.veth}: {result.stderr.strip()}")
            if host.netns in present_ns:
                pids = _ip("netns", "pids", host.netns, check=False).stdout.split()
                if pids:
                    problems.append(f"processes not handed to track() still run in {host.netns}: {' '.join(pids)}")
                result = _ip("netns", "delete", host.netns, check=False)
                if result.returncode != 0:
                    problems.append(f"netns {host.netns}: {result.stderr.strip()}")
        if self.bridge and self.bridge in present_links:
            result = _ip("link", "delete", self.bridge, check=False)
            if result.returncode != 0:
                problems.append(f"link {self.bridge}: {result.stderr.strip()}")
        if problems:
            raise NetnsError("Network clean-up: " + "; ".join(problems))

    # ---- processes

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """The argv running `argv` inside host i's namespace (it stays there, with its children)."""
        return [_ip_binary() or "ip", "netns", "exec", self.hosts[i].netns, *argv]

    def track(self, process: subprocess.Popen) -> subprocess.Popen:
        """Kill `process` (its process group when it leads one) when the network closes."""
        try:
            leads_group = os.getpgid(process.pid) == process.pid and process.pid != os.getpgrp()
        except ProcessLookupError:
            leads_group = False
        self._tracked.append(_Tracked(process, leads_group))
        return process

    def popen(self, i: int, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `argv` in host i's namespace in a session of its own, tracked."""
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return self.track(subprocess.Popen(self.command(i, argv), **kwargs))

    def _signal(self, tracked: _Tracked, sig: int) -> None:
        pid = tracked.process.pid
        with contextlib.suppress(ProcessLookupError):
            if tracked.leads_group:
                # the leader's pid cannot be reused while its group has members
                os.killpg(pid, sig)
            elif tracked.process.poll() is None:
                os.kill(pid, sig)

    def _group_alive(self, tracked: _Tracked) -> bool:
        if tracked.process.poll() is None:
            return True
        return tracked.leads_group and _group_has_live_members(tracked.process.pid)

    def _kill_tracked(self) -> None:
        live = [t for t in self._tracked if self._group_alive(t)]
        for t in live:
            self._signal(t, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(self._group_alive(t) for t in live):
            time.sleep(0.05)
        for t in live:
            if self._group_alive(t):
                self._signal(t, signal.SIGKILL)
        for t in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                t.process.wait(5)
        self._tracked.clear()

    # ---- links

    def cut(self, i: int) -> None:
        """Take host i's link down: no packet between it and anyone else until restore(i)."""
        _ip("link", "set", "dev", self.hosts[i].veth, "down")

    def restore(self, i: int, timeout: float = 10.0) -> None:
        """Bring host i's link back, forget the neighbour (ARP) entries on our links, and return
        once a TCP connect from the root namespace to the host is answered; NetnsError after
        `timeout` seconds."""
        _ip("link", "set", "dev", self.hosts[i].veth, "up")
        # ARP lookups that failed while the link was down would hold the first packets for up
        # to a second: forget the neighbours on our links (ours only: the bridge, each eth0)
        _ip("neigh", "flush", "dev", self.bridge, check=False)
        for host in self.hosts:
            _ip("-n", host.netns, "neigh", "flush", "dev", "eth0", check=False)
        self._wait_usable(self.hosts[i], timeout)

    def _wait_usable(self, host: Host, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not reachable(host.address, timeout=min(1.0, max(0.1, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise NetnsError(f"host {host.name} ({host.address}) not reachable {timeout:g} s after its link came up")
            time.sleep(0.05)

    def names(self) -> list[str]:
        """Every namespace and link name this network uses (what must be gone after close)."""
        return [self.bridge] + [h.veth for h in self.hosts] + [h.netns for h in self.hosts]


__all__ = ["available", "sweep_leftovers", "reachable", "Network", "Host", "NetnsError", "POOL"]
