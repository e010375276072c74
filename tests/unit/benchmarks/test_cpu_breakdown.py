"""benchmarks/cpu_breakdown.py: a py-spy sample is charged to the innermost frame that names a layer."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cpu_breakdown", ROOT / "benchmarks" / "cpu_breakdown.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cb = _load()

RUNNER = "Runner.run (asyncio/runners.py:118)"
SCTP = "RTCSctpTransport._handle_data (aiortc/rtcsctptransport.py:960)"
SACK_PATCH = "_send_sack (engine/p2p/patches/sctp_receiver.py:180)"
DTLS = "RTCDtlsTransport._send_data (aiortc/rtcdtlstransport.py:708)"
SSL = "Connection.send (OpenSSL/SSL.py:2308)"
STUN = "StunProtocol.send_data (aioice/ice.py:343)"
LOOP_THREAD = "LoopThread._main (engine/moe/loop_thread.py:50)"
BACKWARD = "ExpertBackend._backward_batch (engine/moe/backend.py:206)"
CLIP = "clip_grad_norm_ (torch/nn/utils/clip_grad.py:231)"
FRAMING = "Framer.feed (engine/p2p/framing.py:120)"


def test_innermost_layer_wins() -> None:
    assert cb.layer_of([RUNNER, SCTP, SACK_PATCH, DTLS, SSL]) == "dtls"  # SCTP asked DTLS to encrypt
    assert cb.layer_of([RUNNER, DTLS, SCTP]) == "sctp"
    assert cb.layer_of([RUNNER, SCTP, DTLS, STUN]) == "ice"
    assert cb.layer_of([RUNNER, SCTP, FRAMING]) == "framing"
    assert cb.layer_of([RUNNER, SACK_PATCH]) == "sctp"  # the project's SCTP patches count as SCTP
    # ...and its DTLS patch as DTLS: a compiled seal_send or open is charged to the Python frame calling it
    assert cb.layer_of([RUNNER, DTLS, "_sent (engine/p2p/patches/dtls.py:256)"]) == "dtls"
    assert cb.layer_of([RUNNER, "recv_next (engine/p2p/patches/dtls.py:307)", SACK_PATCH]) == "sctp"


def test_time_in_the_loops_own_code_is_the_loop_not_the_package_that_runs_it() -> None:
    assert cb.layer_of([RUNNER]) == "loop"
    assert cb.layer_of(["Thread.run (threading.py:982)", LOOP_THREAD]) == "loop"
    assert cb.layer_of(["Thread.run (threading.py:982)", BACKWARD, CLIP]) == "torch"
    assert cb.layer_of(["Thread.run (threading.py:982)", "<module> (x.py:1)"]) == "other"


@pytest.mark.parametrize("line", ["", "   ", "no-count-here", "a;b x", " 12"])
def test_malformed_lines_are_skipped(line: str) -> None:
    assert cb.parse_line(line) is None


def test_breakdown_shares_per_thread(tmp_path: Path) -> None:
    profile = tmp_path / "host.txt"
    loop = "thread (729): MainThread"
    worker = "thread (1023): experts-cpu_0"
    profile.write_text(
        "\n".join(
            [
                f"{loop};{RUNNER};{SCTP} 6",
                f"{loop};{RUNNER};{DTLS};{SSL} 3",
                f"{loop};{RUNNER} 1",
                f"{worker};{BACKWARD};{CLIP} 10",
                "garbage line",
            ]
        )
    )
    loop_only = cb.breakdown(profile, "MainThread")
    assert loop_only["samples"] == 10
    shares = [loop_only[layer] for layer in ("sctp", "dtls", "loop", "torch")]
    assert shares == [0.6, 0.3, 0.1, 0.0]
    everything = cb.breakdown(profile)
    assert everything["samples"] == 20 and everything["torch"] == 0.5
    assert cb.top_functions(profile, 1) == [(CLIP, 10)]


def test_an_empty_profile_has_no_shares(tmp_path: Path) -> None:
    profile = tmp_path / "empty.txt"
    profile.write_text("")
    result = cb.breakdown(profile)
    assert result["samples"] == 0 and result["sctp"] == 0.0
