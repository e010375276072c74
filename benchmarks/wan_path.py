"""The emulated home link wan.py measures across: three network namespaces in a line (root).

``a`` - ``r`` - ``b``: the router ``r`` adds half the RTT each way (NFQUEUE to ``tests.nat.delay``: this
kernel has no netem), drops packets at random in both directions (iptables ``statistic``,
:meth:`Path3.set_loss`), and shapes r->b with ``tbf`` while :meth:`Path3.bottleneck` holds. Offloads are
off, so every packet is MTU-sized. :meth:`Path3.data_drops` says where the a->b packets lost so far were
dropped. The cases run on it, and what they measure, are ``benchmarks/wan.py``'s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.nat.topology import PYTHON, Proc, no_offloads, sh

A_IP, R_A, R_B, B_IP = "10.77.1.1", "10.77.1.2", "10.77.2.1", "10.77.2.2"


class Path3:
    """Three namespaces in a line; the router in the middle delays, drops and shapes."""

    def __init__(self, rtt_ms: float) -> None:
        tag = f"lahwan{os.getpid()}"
        self.a, self.r, self.b = f"{tag}-a", f"{tag}-r", f"{tag}-b"
        self.log_dir = Path(tempfile.mkdtemp(prefix="lah-wan-"))
        self.loss_rules: list[list[str]] = []
        for ns in (self.a, self.r, self.b):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
        sh("ip", "-n", self.a, "link", "add", "a0", "type", "veth", "peer", "name", "r0", "netns", self.r)
        sh("ip", "-n", self.r, "link", "add", "r1", "type", "veth", "peer", "name", "b0", "netns", self.b)
        for ns, dev, addr in (
            (self.a, "a0", A_IP),
            (self.r, "r0", R_A),
            (self.r, "r1", R_B),
            (self.b, "b0", B_IP),
        ):
            sh("ip", "addr", "add", f"{addr}/24", "dev", dev, ns=ns)
            sh("ip", "link", "set", dev, "up", ns=ns)
            no_offloads(ns, dev)
        sh("ip", "route", "add", "default", "via", R_A, ns=self.a)
        sh("ip", "route", "add", "default", "via", R_B, ns=self.b)
        sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=self.r)
        self.delay = Proc(
            "delay",
            self.r,
            [PYTHON, "-m", "tests.nat.delay", "--queue", "5", "--ms", str(rtt_ms / 2)],
            self.log_dir,
        )
        self.delay.event(timeout=20)
        sh("iptables", "-w", "-t", "mangle", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", "5", ns=self.r)

    def set_loss(self, p: float) -> None:
        for rule in self.loss_rules:
            sh("iptables", "-w", "-t", "mangle", "-D", "FORWARD", *rule, ns=self.r)
        self.loss_rules = []
        if p > 0:
            for dev in ("r0", "r1"):  # r0: data a->b, r1: acknowledgements b->a
                rule = [
                    "-i",
                    dev,
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    str(p),
                    "-j",
                    "DROP",
                ]
                sh("iptables", "-w", "-t", "mangle", "-I", "FORWARD", "1", *rule, ns=self.r)
                self.loss_rules.append(rule)

    def data_drops(self) -> dict[str, int]:
        """Packets a->b lost so far, by where: ``random`` (the loss rule), ``delayer`` (its netlink queue
        overflowing: the delayer is a Python process and a CPU-starved one drops packets no home link
        would), ``bottleneck`` (a full ``tbf`` buffer) and ``rcvbuf`` (datagrams the receiving
        namespace's UDP sockets dropped: a CPU-starved receiver)."""
        drops = {"random": 0, "delayer": 0, "bottleneck": 0, "rcvbuf": 0}
        out = sh("iptables", "-w", "-t", "mangle", "-L", "FORWARD", "-v", "-x", "-n", ns=self.r)
        for line in out.splitlines():
            f = line.split()
            if len(f) > 5 and f[2] == "DROP" and f[5] == "r0":
                drops["random"] += int(f[0])
        for line in sh("cat", "/proc/net/netfilter/nfnetlink_queue", ns=self.r, check=False).splitlines():
            f = line.split()
            drops["delayer"] += int(f[5]) + int(f[6]) if len(f) > 6 else 0  # both directions: an upper bound
        udp = [
            line.split()
            for line in sh("cat", "/proc/net/snmp", ns=self.b).splitlines()
            if line.startswith("Udp:")
        ]
        drops["rcvbuf"] = int(udp[1][udp[0].index("RcvbufErrors")])
        stats = sh("tc", "-s", "qdisc", "show", "dev", "r1", ns=self.r, check=False).split()
        for k, word in enumerate(stats[:-1]):
            if word == "(dropped":
                drops["bottleneck"] += int(stats[k + 1].rstrip(","))
        return drops

    @contextlib.contextmanager
    def bottleneck(self, mbytes_per_s: float, buffer_bytes: int) -> Iterator[None]:
        rate = f"{int(mbytes_per_s * 8000)}kbit"
        sh("tc", "qdisc", "add", "dev", "r1", "root", "tbf", "rate", rate, "burst", "32kb",
           "limit", str(buffer_bytes), ns=self.r)  # fmt: skip
        try:
            yield
        finally:
            sh("tc", "qdisc", "del", "dev", "r1", "root", ns=self.r, check=False)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.delay.stop()
        for ns in (self.a, self.r, self.b):
            for pid in sh("ip", "netns", "pids", ns, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(self.log_dir, ignore_errors=True)
