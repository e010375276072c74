"""Network namespaces, NAT routers, coturn and the coordinator for the NAT testbed (root only).

Layout (every address exists only inside namespaces this module creates; nothing is routed to the real
network; every namespace's default route leads into a veth pair inside that namespace, a silent black
hole)::

    <p>-inet   bridge br0 100.64.0.1/24: the coordinator (TCP 8765) and coturn (UDP 3478, STUN+TURN)
    <p>-pubN   a peer with a public address 100.64.0.(50+N) on the bridge
    <p>-rN     home router: wan 100.64.0.(10+N) on the bridge, lan 10.251.N.1/24, NAT of one kind
    <p>-hN     a home peer 10.251.N.2/24, default route via its router

NAT kinds (iptables in the router namespace):

- ``port_restricted``: ``MASQUERADE`` (keeps the source port for every destination: endpoint-independent
  mapping) and, on FORWARD and INPUT, ``-i wan`` ESTABLISHED,RELATED accept then DROP (address-and-port
  dependent filtering). The INPUT drop matters: without it an unsolicited packet to the router's port
  leaves a conntrack entry that moves the next mapping to another port.
- ``symmetric``: the same filtering with ``MASQUERADE --random-fully`` (a fresh port per destination).
- ``full_cone``: endpoint-independent mapping *and* filtering. ``MASQUERADE`` keeps the port, and
  ``PREROUTING -i wan -p udp -j DNAT --to-destination <host>`` sends every UDP packet arriving on the
  router's WAN address to the one home host, on the same port; FORWARD accepts it. So once the host has
  sent from port X, anyone on the internet reaches it at wan:X (with one host behind the router the
  DNAT needs no per-mapping state; with several hosts this construction would not do). An unsolicited
  packet creates a conntrack entry that already points at host:X, so it cannot move the host's mapping.

Faults are iptables rules in the router's ``mangle`` FORWARD chain (before the ``filter`` table's NAT
filtering, which an NFQUEUE verdict of ACCEPT would otherwise skip): random loss (``statistic``), an
outage (DROP), latency (NFQUEUE to :mod:`tests.nat.delay`), and ``conntrack -F`` for a mapping change.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
INET_ADDR = "100.64.0.1"
COORD_PORT = 8765
TURN_PORT = 3478
STUN_PORT = 3479  # a second STUN server (tests/nat/stun_proc.py), listed after coturn
NAT_KINDS = ("full_cone", "port_restricted", "symmetric")
KINDS = ("public", *NAT_KINDS)
_NS_RE = re.compile(r"^lahnat(\d+)-")
_QUEUE_NUMS = itertools.count(7)


class TestbedUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no iproute2/iptables/coturn...)."""


def sh(*args: str, ns: str | None = None, check: bool = True, timeout: float = 10.0) -> str:
    cmd = ["ip", "netns", "exec", ns, *args] if ns else list(args)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def no_offloads(ns: str, ifname: str) -> None:
    """Segmentation and receive offloads off: a real link carries MTU-sized packets, and iptables'
    loss (statistic match) and delay rules must see those, not 64 KB aggregates of TCP segments;
    otherwise "0.1% loss" would hit TCP about 45 times less often than UDP."""
    sh("ethtool", "-K", ifname, "tso", "off", "gso", "off", "gro", "off", ns=ns, check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> None:
    """Delete testbed namespaces left by runs whose process is gone (a crash skips teardown)."""
    out = sh("ip", "netns", "list", check=False)
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NS_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            sh("ip", "netns", "del", name, check=False)


def check_available() -> None:
    """Raise TestbedUnavailable with the reason if namespaces, NAT or coturn are missing."""
    if os.geteuid() != 0:
        raise TestbedUnavailable("the NAT testbed needs root (network namespaces, iptables)")
    for tool in ("ip", "iptables", "conntrack", "turnserver"):
        if shutil.which(tool) is None:
            raise TestbedUnavailable(f"the NAT testbed needs `{tool}` (scripts/services installs it)")
    probe = f"lahnat{os.getpid()}-probe"
    try:
        sh("ip", "netns", "add", probe)
        sh("iptables", "-t", "nat", "-L", "-n", ns=probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        raise TestbedUnavailable(f"cannot create a network namespace with iptables: {e}") from e
    finally:
        sh("ip", "netns", "del", probe, check=False)


class Proc:
    """A child process inside a namespace speaking JSON lines on stdin/stdout."""

    def __init__(self, name: str, ns: str, args: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.ns = ns
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115  (closed in stop())
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
        )
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            req = msg.get("req")
            with self._lock:
                box = self._replies.get(req) if req is not None else None
            (box if box is not None else self._events).put(msg)
        self._events.put({"event": "exit"})

    def event(self, timeout: float) -> dict[str, Any]:
        try:
            msg = self._events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no event within {timeout} s; log {self.log_path}") from None
        if msg.get("event") == "exit":
            raise RuntimeError(f"{self.name} exited ({self.proc.poll()}); log:\n{self.tail()}")
        return msg

    def send(self, cmd: dict[str, Any]) -> int:
        """Send a command without waiting; :meth:`reply` collects its answer."""
        req = next(self._ids)
        with self._lock:
            self._replies[req] = queue.Queue()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({**cmd, "req": req}) + "\n")
        self.proc.stdin.flush()
        return req

    def reply(self, req: int, timeout: float) -> dict[str, Any]:
        with self._lock:
            box = self._replies[req]
        try:
            msg = box.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(
                f"{self.name}: no reply to #{req} within {timeout} s; {self.log_path}"
            ) from None
        with self._lock:
            self._replies.pop(req, None)
        return msg

    def request(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        return self.reply(self.send(cmd), timeout)

    def tail(self, n: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        return ""

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(timeout=timeout)
        self._log.close()


@dataclass
class Node:
    name: str
    kind: str
    ns: str
    addr: str
    router_ns: str | None = None
    proc: Proc | None = None
    peer_id: str = ""


@dataclass
class Testbed:
    """Namespaces and processes; :meth:`close` removes every one of them."""

    __test__ = False  # not a pytest class

    secret: str = "lah-nat-testbed-secret"
    turn_ttl_s: int = 600
    # Offloads off (MTU-sized packets everywhere): what throughput comparisons need. The fault tests
    # keep the kernel's defaults (per-packet loss then loses handshake flights, which
    # engine/p2p/patches/handshake.py resends on the path's round trip).
    real_packets: bool = False
    prefix: str = field(default_factory=lambda: f"lahnat{os.getpid()}")
    namespaces: list[str] = field(default_factory=list)
    nodes: dict[str, Node] = field(default_factory=dict)
    coordinator: Proc | None = None
    coturn: subprocess.Popen[bytes] | None = None
    stun: Proc | None = None
    delays: list[tuple[str, str, Proc]] = field(default_factory=list)
    log_dir: Path = field(default_factory=lambda: Path(f"/tmp/lahnat-{os.getpid()}"))

    @property
    def inet(self) -> str:
        return f"{self.prefix}-inet"

    @property
    def signaling_url(self) -> str:
        return f"ws://{INET_ADDR}:{COORD_PORT}/ws/signal"

    # -- building --------------------------------------------------------------------------------

    def _ns(self, name: str) -> str:
        ns = f"{self.prefix}-{name}"
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)
        # Default route into a veth pair whose both ends stay in this namespace (no dummy module here),
        # with a static neighbour: anything not on a local subnet is sent into blk1 and vanishes there.
        sh("ip", "link", "add", "blk0", "type", "veth", "peer", "name", "blk1", ns=ns)
        sh("ip", "addr", "add", "169.254.0.1/30", "dev", "blk0", ns=ns)
        sh("ip", "link", "set", "blk0", "up", ns=ns)
        sh("ip", "link", "set", "blk1", "up", ns=ns)
        sh(
            "ip",
            "neigh",
            "add",
            "169.254.0.2",
            "lladdr",
            "02:00:00:00:00:01",
            "dev",
            "blk0",
            "nud",
            "permanent",
            ns=ns,
        )
        sh("ip", "route", "add", "default", "via", "169.254.0.2", "dev", "blk0", ns=ns)
        return ns

    def build_network(self, home: Sequence[tuple[str, str]], public: Sequence[str]) -> None:
        """``home``: (name, NAT kind) of each peer behind its own router; ``public``: public peers' names."""
        remove_stale_namespaces()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        inet = self._ns("inet")
        sh("ip", "link", "add", "br0", "type", "bridge", ns=inet)
        sh("ip", "addr", "add", f"{INET_ADDR}/24", "dev", "br0", ns=inet)
        sh("ip", "link", "set", "br0", "up", ns=inet)
        for i, name in enumerate(public, start=1):
            ns = self._ns(name)
            addr = f"100.64.0.{50 + i}"
            self._veth(ns, "eth0", inet, f"vp{i}", f"{addr}/24")
            self.nodes[name] = Node(name, "public", ns, addr)
        for i, (name, kind) in enumerate(home, start=1):
            if kind not in NAT_KINDS:
                raise ValueError(f"unknown NAT kind {kind!r}")
            router = self._ns(f"r{i}")
            host = self._ns(name)
            wan, lan_net = f"100.64.0.{10 + i}", f"10.251.{i}"
            self._veth(router, "wan", inet, f"vr{i}", f"{wan}/24")
            sh("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "lan", "netns", router, ns=host)
            if self.real_packets:
                no_offloads(host, "eth0")
                no_offloads(router, "lan")
            sh("ip", "addr", "add", f"{lan_net}.2/24", "dev", "eth0", ns=host)
            sh("ip", "link", "set", "eth0", "up", ns=host)
            sh("ip", "addr", "add", f"{lan_net}.1/24", "dev", "lan", ns=router)
            sh("ip", "link", "set", "lan", "up", ns=router)
            sh("ip", "route", "replace", "default", "via", f"{lan_net}.1", "dev", "eth0", ns=host)
            sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=router)
            self._nat(router, kind, f"{lan_net}.2")
            self.nodes[name] = Node(name, kind, host, f"{lan_net}.2", router_ns=router)

    def _veth(self, ns: str, ifname: str, inet: str, bridge_port: str, cidr: str) -> None:
        sh("ip", "link", "add", ifname, "type", "veth", "peer", "name", bridge_port, "netns", inet, ns=ns)
        sh("ip", "link", "set", bridge_port, "master", "br0", "up", ns=inet)
        sh("ip", "addr", "add", cidr, "dev", ifname, ns=ns)
        sh("ip", "link", "set", ifname, "up", ns=ns)
        if self.real_packets:
            no_offloads(ns, ifname)
            no_offloads(inet, bridge_port)

    def _nat(self, router: str, kind: str, host: str) -> None:
        def ipt(*rule: str) -> None:
            sh("iptables", "-w", *rule, ns=router)

        masq = ["-j", "MASQUERADE"] + (["--random-fully"] if kind == "symmetric" else [])
        ipt("-t", "nat", "-A", "POSTROUTING", "-o", "wan", *masq)
        if kind == "full_cone":
            ipt(
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-i",
                "wan",
                "-p",
                "udp",
                "-j",
                "DNAT",
                "--to-destination",
                host,
            )
            ipt("-A", "FORWARD", "-i", "wan", "-p", "udp", "-d", host, "-j", "ACCEPT")
        for chain in ("FORWARD", "INPUT"):
            ipt(
                "-A",
                chain,
                "-i",
                "wan",
                "-m",
                "conntrack",
                "--ctstate",
                "ESTABLISHED,RELATED",
                "-j",
                "ACCEPT",
            )
            ipt("-A", chain, "-i", "wan", "-j", "DROP")

    # -- services --------------------------------------------------------------------------------

    def start_coturn(self, secret: str | None = None) -> None:
        conf = self.log_dir / "turnserver.conf"
        conf.write_text(
            "\n".join(
                [
                    f"listening-ip={INET_ADDR}",
                    f"relay-ip={INET_ADDR}",
                    f"listening-port={TURN_PORT}",
                    "min-port=40000",
                    "max-port=40999",
                    "use-auth-secret",
                    f"static-auth-secret={secret or self.secret}",
                    "realm=lah.test",
                    "fingerprint",
                    "no-tls",
                    "no-dtls",
                    "no-tcp-relay",
                    "no-cli",
                    "no-software-attribute",
                    # home peers' host candidates are private; refuse them instead of failing the allocation
                    "denied-peer-ip=10.0.0.0-10.255.255.255",
                    f"userdb={self.log_dir / 'turndb'}",
                    f"pidfile={self.log_dir / 'turnserver.pid'}",
                    f"log-file={self.log_dir / 'turnserver.log'}",
                    "simple-log",
                ]
            )
            + "\n"
        )
        self.coturn = subprocess.Popen(
            ["ip", "netns", "exec", self.inet, "turnserver", "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_udp_listen(self.inet, TURN_PORT, timeout=10)

    def stop_coturn(self) -> None:
        if self.coturn is not None:
            self.coturn.terminate()
            try:
                self.coturn.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.coturn.kill()
                self.coturn.wait(timeout=5)
            self.coturn = None

    def _wait_udp_listen(self, ns: str, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if f":{port} " in sh("ss", "-uln", ns=ns, check=False):
                return
            if self.coturn is not None and self.coturn.poll() is not None:
                break
            time.sleep(0.1)
        log = self.log_dir / "turnserver.log"
        text = log.read_text()[-2000:] if log.exists() else ""
        raise RuntimeError(f"coturn did not listen on udp {port} within {timeout} s:\n{text}")

    def start_stun(self) -> None:
        args = [PYTHON, "-m", "tests.nat.stun_proc", "--host", INET_ADDR, "--port", str(STUN_PORT)]
        self.stun = Proc("stun", self.inet, args, self.log_dir)
        self.stun.event(timeout=30)  # {"event": "ready"}

    def start_coordinator(
        self, *, turn: bool = True, secret: str | None = None, ttl_s: int | None = None
    ) -> None:
        args = [PYTHON, "-m", "tests.nat.coordinator_proc", "--host", INET_ADDR, "--port", str(COORD_PORT)]
        if turn:
            args += ["--turn", f"{INET_ADDR}:{TURN_PORT}", "--secret", secret or self.secret]
            if self.stun is not None:
                args += ["--stun", f"{INET_ADDR}:{STUN_PORT}"]
            args += ["--ttl", str(self.turn_ttl_s if ttl_s is None else ttl_s)]
        self.coordinator = Proc("coordinator", self.inet, args, self.log_dir)
        self.coordinator.event(timeout=30)  # {"event": "ready"}

    def stop_coordinator(self) -> None:
        if self.coordinator is not None:
            self.coordinator.stop()
            self.coordinator = None

    def start_peers(self, names: Sequence[str] | None = None, connect_timeout: float = 10.0) -> None:
        """Start the peer processes (in parallel: each imports torch) and wait for their ids."""
        chosen = [self.nodes[n] for n in (names or list(self.nodes))]
        for node in chosen:
            args = [PYTHON, "-m", "tests.nat.peer_proc", "--signal", self.signaling_url, "--host", node.addr]
            args += ["--connect-timeout", str(connect_timeout)]
            node.proc = Proc(node.name, node.ns, args, self.log_dir)
        for node in chosen:
            assert node.proc is not None
            ready = node.proc.event(timeout=60)
            node.peer_id = ready["id"]

    def stop_peer(self, name: str) -> None:
        node = self.nodes[name]
        if node.proc is not None:
            node.proc.stop()
            node.proc = None

    # -- faults ----------------------------------------------------------------------------------

    def _mangle(self, router: str, action: str, rule: Sequence[str]) -> None:
        sh("iptables", "-w", "-t", "mangle", action, "FORWARD", *rule, ns=router)

    @contextlib.contextmanager
    def loss(self, name: str, probability: float) -> Iterator[None]:
        """Drop each packet through ``name``'s router (both directions) with ``probability``."""
        router = self._router(name)
        rule = ["-m", "statistic", "--mode", "random", "--probability", str(probability), "-j", "DROP"]
        self._mangle(router, "-I", ["1", *rule])
        try:
            yield
        finally:
            self._mangle(router, "-D", rule)

    @contextlib.contextmanager
    def outage(self, name: str) -> Iterator[None]:
        router = self._router(name)
        self._mangle(router, "-I", ["1", "-j", "DROP"])
        try:
            yield
        finally:
            self._mangle(router, "-D", ["-j", "DROP"])

    @contextlib.contextmanager
    def latency(self, name: str, delay_ms: float, jitter_ms: float = 0.0) -> Iterator[None]:
        """Delay every packet through ``name``'s router by ``delay_ms`` ± ``jitter_ms`` each way."""
        router = self._router(name)
        num = next(_QUEUE_NUMS)
        args = [PYTHON, "-m", "tests.nat.delay", "--queue", str(num), "--ms", str(delay_ms)]
        args += ["--jitter", str(jitter_ms)]
        proc = Proc(f"delay{num}", router, args, self.log_dir)
        rule = ["-j", "NFQUEUE", "--queue-num", str(num), "--queue-bypass"]
        try:
            proc.event(timeout=10)  # bound to the queue
            self._mangle(router, "-A", rule)
            try:
                yield
            finally:
                self._mangle(router, "-D", rule)
        finally:
            proc.stop()

    def flush_mappings(self, name: str) -> None:
        """Forget every NAT mapping of ``name``'s router: the next packets get new ones."""
        sh("conntrack", "-F", ns=self._router(name), check=False)

    def _router(self, name: str) -> str:
        router = self.nodes[name].router_ns
        if router is None:
            raise ValueError(f"{name} has no router")
        return router

    # -- teardown --------------------------------------------------------------------------------

    def close(self) -> None:
        running = [node.proc for node in self.nodes.values() if node.proc is not None]
        for proc in running:  # every peer starts shutting down at once, then we wait for each
            with contextlib.suppress(OSError, ValueError):
                assert proc.proc.stdin is not None
                proc.proc.stdin.close()
        for node in self.nodes.values():
            if node.proc is not None:
                with contextlib.suppress(Exception):
                    node.proc.stop()
                node.proc = None
        with contextlib.suppress(Exception):
            self.stop_coordinator()
        with contextlib.suppress(Exception):
            self.stop_coturn()
        if self.stun is not None:
            with contextlib.suppress(Exception):
                self.stun.stop()
            self.stun = None
        for ns in reversed(self.namespaces):
            # kill anything still running in the namespace, then delete it (its veths go with it)
            for pid in sh("ip", "netns", "pids", ns, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()


def peer_pairs(kinds: Sequence[str] = KINDS) -> list[tuple[str, str]]:
    """Every unordered pair of kinds, a kind with itself included."""
    return [(a, b) for i, a in enumerate(kinds) for b in kinds[i:]]


def standard_nodes() -> tuple[list[tuple[str, str]], list[str]]:
    """Two peers of each NAT kind (each behind its own router) and two public peers."""
    home = [(f"{kind[:3]}{n}", kind) for kind in NAT_KINDS for n in (1, 2)]
    return home, ["pub1", "pub2"]


def node_for(kind: str, n: int) -> str:
    return f"{kind[:3]}{n}"


def needs_relay(a: str, b: str) -> bool:
    """Whether NAT kinds a and b rule out a direct path (RFC 4787 behaviours emulated above)."""
    pair = {a, b}
    return pair in ({"symmetric"}, {"symmetric", "port_restricted"})
