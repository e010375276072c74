"""Peers behind emulated NATs in network namespaces: connectivity matrix, faults, bad input.

Everything runs in namespaces this module creates (see tests/nat/topology.py); only when they cannot be
created (not root, tools missing) is the whole module skipped, with the reason. One testbed serves the
module: two peers per NAT kind (full cone, port-restricted cone, symmetric), two public peers, coturn
and the coordinator, each a process in its namespace. Every test starts from fresh links.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.nat import topology
from tests.nat.scenarios import call, drop_all_links, run_matrix, standard_testbed, summarize, table
from tests.nat.topology import Testbed

pytestmark = pytest.mark.integration

CONNECT_TIMEOUT = 15.0  # the engine's default LinkConfig.connect_timeout


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    try:
        topology.check_available()
    except topology.TestbedUnavailable as e:
        pytest.skip(f"NAT TESTBED NOT RUN: {e}")
    with standard_testbed(connect_timeout=CONNECT_TIMEOUT) as bed:
        yield bed


@pytest.fixture
def fresh(tb: Testbed) -> Testbed:
    drop_all_links(tb)
    return tb


def ok(out: dict[str, Any]) -> dict[str, Any]:
    assert out["ok"], out
    return out


def wait_signaling(tb: Testbed, timeout: float = 30.0) -> None:
    """Until every peer is back on the coordinator's socket (its reconnect backoff is up to 30 s)."""
    deadline = time.monotonic() + timeout
    for node in tb.nodes.values():
        assert node.proc is not None
        while not node.proc.request({"cmd": "ice"}, timeout=10)["signaling"]:
            assert time.monotonic() < deadline, f"{node.name} did not rejoin signaling in {timeout} s"
            time.sleep(0.2)


def test_every_pair_of_nat_kinds_connects(fresh: Testbed) -> None:
    results = run_matrix(fresh)
    print(table(results))
    summary = summarize(results)
    print(summary)
    assert summary["connected"] == summary["pairs"] == 10, table(results)
    for r in results:
        assert r.types is not None
        if r.expect_relay:
            assert r.relayed, f"{r.kinds} cannot connect directly, yet got {r.types}"
        else:  # direct pairs get a head start over relayed ones (engine/p2p/patches/ice.py)
            assert not r.relayed, f"{r.kinds} could connect directly, yet went through TURN: {r.types}"
        assert r.connect_ms is not None and r.connect_ms < 2000, f"{r.kinds} took {r.connect_ms:.0f} ms"


def test_latency_100ms_rtt_with_jitter(fresh: Testbed) -> None:
    with fresh.latency("por1", delay_ms=50, jitter_ms=10):  # both directions: RTT +100 ms +-20 ms
        out = ok(call(fresh, "por1", "pub1", nbytes=1 << 20, timeout=30))
        assert out["connect_ms"] > 100  # the delay is really there: ICE needs at least one round trip
        again = ok(call(fresh, "por1", "pub1", nbytes=1 << 20, timeout=30))
        assert again["connect_ms"] is None  # the same link
    ok(call(fresh, "por1", "pub1", nbytes=1 << 20, timeout=20))


@pytest.mark.parametrize("loss", [0.01, 0.05])
def test_packet_loss(fresh: Testbed, loss: float) -> None:
    """Random loss on every packet through ful1's router (signaling, STUN and TURN, ICE, DTLS, SCTP).

    Each connect must finish within the engine's 15 s. That bound follows from the handshakes' schedule,
    not from a lucky draw: to pass it, one exchange must fail about five times in a row (ICE checks at
    0, 0.5, 1.5, 3.5, 7.5 s; DTLS flights copied after 0.1, 0.3, 0.7, 1.5, 3.1 s besides OpenSSL's own
    resends at 1, 3, 7 s; INIT from 0.3 s, doubling), about (2 x 5%)^5 = 1e-5 per connect at 5%.
    tests/integration/test_handshake_loss.py loses chosen packets and asserts the schedule itself;
    benchmarks/connect_loss.py measures the distribution (docs/measurements/connect-loss-*.md)."""
    with fresh.loss("ful1", loss):
        for _ in range(3):  # fresh links: three connects under loss, each with data both ways
            drop_all_links(fresh)
            out = ok(call(fresh, "ful1", "pub1", nbytes=64 << 10, timeout=40))
            assert out["connect_ms"] is not None and out["connect_ms"] < CONNECT_TIMEOUT * 1000, out
            print(f"loss {loss:.0%}: connect {out['connect_ms']:.0f} ms")
        ok(call(fresh, "ful1", "pub1", nbytes=1 << 20, timeout=40))
        ok(call(fresh, "ful1", "por1", nbytes=256 << 10, timeout=40))


def test_link_down_10s_and_back(fresh: Testbed) -> None:
    ok(call(fresh, "pub1", "por1", timeout=20))
    with fresh.outage("por1"):
        started = time.monotonic()
        out = call(fresh, "pub1", "por1", nbytes=256 << 10, timeout=3)
        assert not out["ok"] and out["error"].startswith("RpcTimeout"), out
        assert time.monotonic() - started < 3 + 5  # fails within its timeout (+ process round trip)
        time.sleep(max(0.0, 10 - (time.monotonic() - started)))
    # The link either survived (aioice's consent needs ~30 s of silence to fail it) or is re-dialed.
    deadline = time.monotonic() + 60
    while True:
        out = call(fresh, "pub1", "por1", nbytes=256 << 10, timeout=20)
        if out["ok"] or time.monotonic() > deadline:
            break
    ok(out)
    ok(call(fresh, "por1", "pub1", nbytes=256 << 10, timeout=20))


def test_nat_mapping_change(fresh: Testbed) -> None:
    """conntrack -F on a symmetric NAT: the peer's next packets leave from a new port."""
    first = ok(call(fresh, "pub1", "sym1", timeout=20))
    fresh.flush_mappings("sym1")
    started = time.monotonic()
    out = call(fresh, "pub1", "sym1", nbytes=64 << 10, timeout=3)
    assert not out["ok"] and out["error"].startswith("RpcTimeout"), out
    # pub1 keeps sending to the dead mapping until it hears from the new one: sym1's next consent check
    # (every ~5 s) arrives from the new port and aioice moves the pair there; if it did not, consent
    # (6 misses) would fail the link after ~30 s and the pool would re-dial.
    deadline = started + 75
    while True:
        out = call(fresh, "pub1", "sym1", nbytes=64 << 10, timeout=5)
        if out["ok"] or time.monotonic() > deadline:
            break
    recovered_s = time.monotonic() - started
    print(f"mapping change: first {first['addrs']}, recovered after {recovered_s:.1f} s: {out}")
    ok(out)
    assert out["addrs"] != first["addrs"]  # the traffic now uses the new mapping
    ok(call(fresh, "sym1", "pub1", timeout=20))


def _restart_peers(tb: Testbed, names: list[str]) -> None:
    for name in names:
        tb.stop_peer(name)
    tb.start_peers(names, connect_timeout=CONNECT_TIMEOUT)


def test_bad_turn_credentials(fresh: Testbed) -> None:
    """Credentials coturn refuses (wrong secret, then expired): relay-only pairs fail, direct ones work."""
    tb = fresh
    try:
        for bad in ("wrong_secret", "expired"):
            tb.stop_coordinator()
            if bad == "wrong_secret":
                tb.start_coordinator(secret="not-" + tb.secret)
            else:
                tb.start_coordinator(ttl_s=-60)
            # Restarted peers join the new coordinator and get its (bad) TURN credentials.
            _restart_peers(tb, ["sym1", "sym2"])
            sym1 = tb.nodes["sym1"].proc
            assert sym1 is not None
            probe = sym1.request({"cmd": "turn_probe"}, timeout=20)
            assert not probe["ok"] and "401" in probe["servers"][0]["error"], (bad, probe)
            if bad == "wrong_secret":
                relayed = sym1.send({"cmd": "call", "peer": tb.nodes["sym2"].peer_id, "timeout": 25})
                wait_signaling(tb)
                ok(call(tb, "sym1", "pub1", timeout=20))  # a direct path needs no TURN
                out = sym1.reply(relayed, timeout=40)
                assert not out["ok"] and out["error"].startswith("ConnectError"), out
                assert "TURN server" in out["error"] and "401" in out["error"], out  # says why
                print(f"{bad}: relayed pair: {out['error']} | TURN probe: {probe['servers']}")
    finally:
        tb.stop_coordinator()
        tb.start_coordinator()
        _restart_peers(tb, ["sym1", "sym2"])
        wait_signaling(tb)
    ok(call(tb, "sym1", "sym2", timeout=20))  # fresh credentials: relayed again


def test_coturn_down(fresh: Testbed) -> None:
    """coturn (the first STUN server and the only TURN) down: the second STUN server is used at once."""
    tb = fresh
    tb.stop_coturn()
    try:
        sym1, ful1 = tb.nodes["sym1"].proc, tb.nodes["ful1"].proc
        assert sym1 is not None and ful1 is not None
        probe_req = sym1.send({"cmd": "turn_probe"})
        # Gathering skips the dead server within the probe deadline and learns public addresses from
        # the live STUN server: pairs whose NATs allow a direct path still connect, cone <-> cone too.
        cone = ok(call(tb, "ful1", "ful2", timeout=CONNECT_TIMEOUT + 5))
        assert cone["types"] and "relay" not in cone["types"], cone
        direct = ok(call(tb, "pub1", "sym1", timeout=25))
        # Without TURN, symmetric <-> symmetric has no path at all.
        relayed = call(tb, "sym1", "sym2", timeout=CONNECT_TIMEOUT + 5)
        assert not relayed["ok"] and relayed["error"].startswith("ConnectError"), relayed
        probe = sym1.reply(probe_req, timeout=30)
        assert not probe["ok"], probe
        print(
            "coturn down: cone pair",
            cone["connect_ms"],
            "ms",
            cone["types"],
            "| public<->symmetric",
            direct["connect_ms"],
            "ms | symmetric pair:",
            relayed["error"],
        )
    finally:
        tb.start_coturn()
    drop_all_links(tb)
    ok(call(tb, "sym1", "sym2", timeout=20))


def test_coordinator_down_after_connect(fresh: Testbed) -> None:
    tb = fresh
    ok(call(tb, "pub1", "por1", timeout=20))
    ok(call(tb, "sym1", "sym2", timeout=20))
    tb.stop_coordinator()
    try:
        for _ in range(3):
            ok(call(tb, "pub1", "por1", nbytes=256 << 10, timeout=20))
            ok(call(tb, "sym2", "sym1", nbytes=256 << 10, timeout=20))
        out = call(tb, "ful1", "ful2", timeout=5)  # a new link needs signaling
        assert not out["ok"] and "signaling" in out["error"].lower(), out
    finally:
        tb.start_coordinator()
        wait_signaling(tb)
    ok(call(tb, "ful1", "ful2", timeout=20))


def test_dmoe_training_goes_on_through_nats_and_faults(fresh: Testbed) -> None:
    """A trainer behind a symmetric NAT trains through experts behind every kind of router, while its
    own link loses 5% of packets and one host's link has 100 ms of added round trip with jitter."""
    tb = fresh
    hosts = {"ffn.0.0": "por1", "ffn.0.1": "sym2", "ffn.1.0": "pub1", "ffn.1.1": "ful2"}
    for uid, name in hosts.items():
        proc = tb.nodes[name].proc
        assert proc is not None
        ok(proc.request({"cmd": "host", "uids": [uid], "dim": 32, "hidden": 64}, timeout=30))
    trainer = tb.nodes["sym1"].proc
    assert trainer is not None
    cmd = {
        "cmd": "train",
        "hosts": {uid: tb.nodes[name].peer_id for uid, name in hosts.items()},
        "steps": 60,
        "dim": 32,
        "hidden": 64,
        "timeout": 5.0,
    }
    with tb.loss("sym1", 0.05), tb.latency("por1", delay_ms=50, jitter_ms=10):
        out = ok(trainer.request(cmd, timeout=300))
    print(
        "DMoE through NATs with faults:", {k: out[k] for k in ("accuracy", "steps", "skipped", "max_step_s")}
    )
    assert out["steps"] + out["skipped"] == 60 and out["skipped"] <= 20
    assert out["accuracy"] > 0.5  # chance is 0.1
    assert out["max_step_s"] < 2 * (5.0 + 1.0)  # forward and backward, each bounded by the timeout


def test_a_trainer_behind_a_symmetric_nat_averages_as_a_client(fresh: Testbed) -> None:
    """sym1 (symmetric NAT) joins an all-reduce with two public trainers and one behind a
    port-restricted cone: it sends its parts and takes the averages back, reducing nothing, over a
    direct path to the public ones and through coturn to the cone one."""
    from engine.collab import balance_parts

    names = ["pub1", "pub2", "por1", "sym1"]
    procs = {name: fresh.nodes[name].proc for name in names}
    ids = {name: fresh.nodes[name].peer_id for name in names}
    assert all(p is not None for p in procs.values())
    sym = procs["sym1"]
    assert sym is not None
    role = ok(sym.request({"cmd": "collab_role", "peers": [ids[n] for n in names[:3]]}, timeout=40))
    assert role["relayed"] == [ids["por1"]], role  # the cone peer only through TURN, the public ones direct
    assert role["client"]  # the engine's rule: a trainer with a relayed link acts as a client
    for name in ("pub1", "pub2"):
        p = procs[name]
        assert p is not None
        ok(p.request({"cmd": "collab_role", "peers": [ids[n] for n in names if n != name]}, timeout=40))
    n = 100_000  # 400 KB: a few chunks each way on every link, relayed ones included
    parts = balance_parts(n, [2e6, 1e6, 1e6, 0.0])  # as the leader freezes it: the client reduces nothing
    assert parts[3] == 0 and all(parts[:3])
    members = [ids[name] for name in names]
    weights = [1.0, 2.0, 3.0, 4.0]
    reqs = {}
    for i, name in enumerate(names):
        p = procs[name]
        assert p is not None
        cmd = {"cmd": "allreduce", "round": "nat/1", "members": members, "parts": list(parts)}
        reqs[name] = p.send({**cmd, "value": float(10 * i), "weight": weights[i]})
    outs = {}
    for name in names:
        p = procs[name]
        assert p is not None
        outs[name] = ok(p.reply(reqs[name], timeout=90))
    expected = sum(w * 10 * i for i, w in enumerate(weights)) / sum(weights)  # + index / n everywhere
    for name, out in outs.items():
        assert out["complete"], (name, out)
        assert out["head"] == outs["pub1"]["head"] and out["tail"] == outs["pub1"]["tail"]  # same bits
        assert abs(out["head"][0] - expected) < 1e-4 and abs(out["tail"][-1] - (expected + 1)) < 1e-3
    client = outs["sym1"]
    assert not client["reduced"] and all(outs[name]["reduced"] for name in names[:3])
    assert client["bytes_sent"] >= 4 * n and client["bytes_received"] >= 4 * n  # all of it out and back
