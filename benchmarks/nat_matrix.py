"""NAT matrix and WAN throughput on the namespace testbed (root; see tests/nat/topology.py).

1. Every pair of kinds (public, full cone, port-restricted cone, symmetric) connects through the
   coordinator's signaling, with coturn as STUN and TURN: candidate types of the nominated pair and the
   time to connect (no added latency).
2. One WAN path, public peer <-> port-restricted peer, with latency (half the RTT each way, NFQUEUE) and
   random loss (iptables statistic) in the home router: Peer.call with big tensors (``sink``) and a plain
   TCP stream between the same two namespaces, side by side.

Prints a table and a final JSON line: pairs, connected, relayed, connect_ms_p50, connect_ms_p99, wan_MBps,
wan_tcp_<controller>_MBps and wan_tcp_cc (TCP's congestion controller, pinned per socket: this machine's
default is BBR, which new namespaces inherit, so an unnamed "TCP" figure would mislead).
Usage: ``sudo .venv/bin/python -m benchmarks.nat_matrix [--wan-mib 8] [--tcp-cc cubic]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tests.nat import topology
from tests.nat.scenarios import as_dicts, run_matrix, standard_testbed, summarize, table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wan-mib", type=int, default=8, help="MiB moved by Peer.call over the WAN path")
    parser.add_argument("--tcp-mib", type=int, default=32, help="MiB moved by the plain TCP stream")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--loss", type=float, default=0.001)
    parser.add_argument("--chunk-kib", type=int, default=4096, help="tensor bytes per call")
    parser.add_argument("--tcp-cc", default="cubic", help="TCP congestion controller of the baseline")
    args = parser.parse_args()
    try:
        topology.check_available()
    except topology.TestbedUnavailable as e:
        print(f"NAT testbed unavailable: {e}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with standard_testbed(real_packets=True) as tb:  # MTU-sized packets: a fair TCP comparison
        print(f"testbed up in {time.monotonic() - started:.1f} s", flush=True)
        results = run_matrix(tb)
        print(table(results), flush=True)
        summary = summarize(results)

        client, server = tb.nodes["por1"], tb.nodes["pub1"]
        assert client.proc is not None and server.proc is not None
        with tb.latency("por1", delay_ms=args.rtt_ms / 2), tb.loss("por1", args.loss):
            bench = client.proc.request(
                {
                    "cmd": "bench",
                    "peer": server.peer_id,
                    "bytes": args.wan_mib << 20,
                    "chunk": args.chunk_kib << 10,
                    "timeout": 240,
                },
                timeout=260,
            )
            server.proc.request({"cmd": "tcp_listen", "port": 9000}, timeout=10)
            tcp = client.proc.request(
                {
                    "cmd": "tcp_send",
                    "host": server.addr,
                    "port": 9000,
                    "bytes": args.tcp_mib << 20,
                    "timeout": 120,
                    "cc": args.tcp_cc,
                },
                timeout=130,
            )
        wan = f"RTT +{args.rtt_ms:.0f} ms, loss {args.loss:.2%}, por1 -> pub1"
        call_mbps, tcp_mbps = bench.get("MBps", 0.0), tcp.get("MBps", 0.0)
        print(
            f"WAN ({wan}): Peer.call {call_mbps:.2f} MB/s {bench.get('types')}, "
            f"TCP {tcp.get('cc', args.tcp_cc)} {tcp_mbps:.2f} MB/s"
        )
        if not bench["ok"] or not tcp["ok"]:
            print(f"WAN run failed: call {bench}, tcp {tcp}", file=sys.stderr)
        summary.update(
            wan_MBps=round(bench["MBps"], 3) if bench["ok"] else None,
            wan_tcp_cc=tcp.get("cc", args.tcp_cc),
            **{f"wan_tcp_{args.tcp_cc}_MBps": round(tcp["MBps"], 3) if tcp["ok"] else None},
            wan_path=wan,
            wan_call_types=bench.get("types"),
            matrix=[
                {"kinds": r["kinds"], "types": r["types"], "connect_ms": r["connect_ms"], "error": r["error"]}
                for r in as_dicts(results)
            ],
        )
    for key in ("connect_ms_p50", "connect_ms_p99"):
        if summary[key] is not None:
            summary[key] = round(summary[key], 1)
    print(json.dumps(summary))
    return 0 if summary["connected"] == summary["pairs"] else 1


if __name__ == "__main__":
    sys.exit(main())
