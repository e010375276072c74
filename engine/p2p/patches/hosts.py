"""Host candidate pinning: aioice gathers ICE host candidates only on the addresses we name.

aioice never offers 127.0.0.1 and otherwise offers every interface address. Tests and the local demo must
only use loopback (or addresses of namespaces they made), so :func:`pin_host_addresses` makes aioice
gather host candidates on exactly the given addresses. Process-wide on purpose: one process is one
node, and a node lives at one set of addresses.
"""

from __future__ import annotations

from collections.abc import Sequence

import aioice.ice

_stock_get_host_addresses = aioice.ice.get_host_addresses
_pinned_hosts: list[str] | None = None


def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    if _pinned_hosts is None:
        return _stock_get_host_addresses(use_ipv4, use_ipv6)  # type: ignore[no-any-return]
    return [a for a in _pinned_hosts if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]


def pin(addresses: Sequence[str] | None) -> None:
    global _pinned_hosts
    _pinned_hosts = None if addresses is None else list(addresses)


def pinned() -> list[str] | None:
    return None if _pinned_hosts is None else list(_pinned_hosts)
