"""``seal_send``: the compiled record layer's own sendto, over real UDP sockets on loopback."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from engine.p2p import native

pytestmark = pytest.mark.integration


def _layers() -> tuple[Any, Any]:
    module = native.records()
    if module is None:
        pytest.fail(f"compiled record layer not built: {native.status()}")
    wk, wi, rk, ri = os.urandom(16), os.urandom(4), os.urandom(16), os.urandom(4)
    return (
        module.RecordLayer("AES128-GCM", wk, wi, rk, ri, 1, 0, -1),
        module.RecordLayer("AES128-GCM", rk, ri, wk, wi, 1, 0, -1),
    )


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_records_sent_by_seal_send_open_on_the_other_side(family: int, host: str) -> None:
    try:
        rx = socket.socket(family, socket.SOCK_DGRAM)
        rx.bind((host, 0))
    except OSError as e:  # a kernel built or booted without IPv6
        pytest.skip(f"no {host} here: {e}")
    tx = socket.socket(family, socket.SOCK_DGRAM)
    tx.setblocking(False)
    rx.settimeout(5)
    a, b = _layers()
    a.set_destination(tx.fileno(), host, rx.getsockname()[1])
    payloads = [os.urandom(1189) for _ in range(100)]
    try:
        got = []
        for p in payloads:  # one at a time: a full buffer would hand the record back, not lose it
            assert a.seal_send(p) is None
            got.append(b.open(rx.recv(2048)))
        assert got == payloads and a.sealed == 100 and b.opened == 100
    finally:
        tx.close()
        rx.close()


def test_a_closed_socket_is_an_oserror() -> None:
    a, _ = _layers()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    fd = s.fileno()
    a.set_destination(fd, "127.0.0.1", 9)
    s.close()
    with pytest.raises(OSError):
        a.seal_send(b"x")
    assert a.write_seq == 1  # the record's sequence number is spent: it never repeats
