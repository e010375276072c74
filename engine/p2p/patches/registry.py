"""The one list of everything the project replaces in aiortc and aioice, with the source hash of each.

Each :class:`Patch` names an original by dotted path, the sha256 of ``inspect.getsource`` of it as
written in the pinned versions, and its replacement (None: not replaced, but a replacement relies on
how it behaves, so a change to it must be reviewed too). Patches form groups that are installed whole
or not at all: ``hosts`` (candidate pinning, needed by tests and the demo), ``guard`` (a bounded packet
parser and a link that fails alone: :mod:`.sctp_guard`), ``sctp``, ``ice`` and
``dtls`` (speed and recovery; only on the pinned versions; ``dtls`` also hashes the pyOpenSSL and aioice
internals it calls) and ``handshake`` (the DTLS and SCTP handshake timers under loss: :mod:`.handshake`).
:func:`verify` says what does not match; the package's ``install`` then leaves that group stock and warns.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

import aioice
import aiortc

from . import (
    compiled_sctp,
    dtls,
    handshake,
    hosts,
    ice,
    sctp_guard,
    sctp_receiver,
    sctp_sack,
    sctp_sender,
    sctp_timers,
)

PINNED = {"aiortc": "1.16.0", "aioice": "0.13.0"}
# written against PINNED; "hosts" and "guard" only need their hashes to match (the guard's replacements
# do what stock does, with every length checked: a node on any aiortc with these sources wants them)
VERSIONED_GROUPS = ("sctp", "ice", "dtls", "handshake")


@dataclass(frozen=True)
class Patch:
    name: str  # dotted path of the original, e.g. "aiortc.rtcsctptransport.RTCSctpTransport._transmit"
    sha256: str
    group: str
    replacement: Any = None


def _resolve(name: str) -> tuple[Any, str]:
    """(object holding the attribute, attribute name) for a dotted path."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:-1]:
            owner = getattr(owner, attr)
        return owner, parts[-1]
    raise ValueError(f"cannot resolve {name}")


_T = "aiortc.rtcsctptransport.RTCSctpTransport."
_S = sctp_sender
_R = sctp_receiver

_D = "aiortc.rtcdtlstransport.RTCDtlsTransport."
_DTLS_RELIED = (  # not replaced; dtls.py calls or reads them (pyOpenSSL internals, aioice's queue and pair)
    ("OpenSSL.SSL.Connection.__init__", "3161e88318ab241317736fb6efcdb580175e822127ab37e0b05e5083828734f3"),
    ("OpenSSL.SSL.Connection.recv", "84b0e9671ae37797ed9604ca3e0001a20882bd7d0051e26a1f4df66aaef06ef4"),
    ("OpenSSL.SSL.Connection.send", "3a17d0bf025164cfbbc909c7362fdeb27d1e9f135f3ebaf9ce4376fe5e198625"),
    ("OpenSSL.SSL.Connection.bio_read", "bc83763ed40fc664a3015c30cdd5c5eb65d73cc09783f9686af0d814280825b3"),
    ("OpenSSL.SSL.Connection.bio_write", "2198d63b78ada6dcd59c1e6d6f1b0d80b8f484637acd7633eb14f8d392f6a2a4"),
    (
        "OpenSSL.SSL.Connection._raise_ssl_error",
        "04b0d7964c73ea9eb7948883b2bd1c1d7d188ca9b5826f73f339de781868b18f",
    ),
    (
        "OpenSSL.SSL.Connection._handle_bio_errors",
        "eaea77f2e1fab12efa994b7249e5b49a82743dcbc25a9cc4d36af8b667b8af20",
    ),
    ("aioice.ice.Connection.recvfrom", "676acc01e4a9a9da04d94d86092a81ba17f1ef77bed0322c8302e3436310e863"),
    ("aioice.ice.Connection.sendto", "bf162ec03bdce2cc2b9602cd47a03aa70b15b45383da4d0618090e65179f7e85"),
    (
        "aioice.ice.Connection.data_received",
        "5631b17fab717d6b9a956b775d6f5580a50c2419dc6ef693286a98355e98a253",
    ),
    # the compiled layer writes the packets these write: the format must not have moved
    (
        "aiortc.rtcsctptransport.serialize_packet",
        "5731d38491422e4c9c0331ef7fedc1c96cf884008aa05573e9b92dee59e04548",
    ),
    (
        "aiortc.rtcsctptransport.DataChunk.__bytes__",
        "46266f41c81fd18d7cf69b4b5a4ada2e6e394fd51b014f1724879223827b0d9f",
    ),
    ("aioice.ice.StunProtocol.send_data", "8bfbce074a897482d13dba6bf49ff6f09e48f84327143b801a3a12d2e43de358"),
    (
        "aiortc.rtcicetransport.RTCIceTransport.start",
        "54279d028c0eb849cff7c9352d445b1cc5496a37a7b6a8d23cda83d64a5f635a",
    ),
)

_HANDSHAKE_RELIED = (  # not replaced; handshake.py sits on the ICE transport's _send (and on aioice's
    # Connection.data_received, hashed above) as instance attributes, T1 starts right after _init sends the
    # INIT, and an INIT is resent through serialize_packet (hashed above)
    (
        "aiortc.rtcicetransport.RTCIceTransport.__init__",
        "b11403aba1c3a32ba72e4c81dc2f4bafe8be21a178e82147d20e011c44c0483c",
    ),
    (_T + "_init", "46e38c9bf7095b6d6fb1ef92fed1695ed557f9ea8dd4135e1a254d061b3e0567"),
)

PATCHES: tuple[Patch, ...] = (
    Patch(
        "aioice.ice.get_host_addresses",
        "d4a54f9a68c39ff1bed532e76bd148cf1530aeb35b9be32900b53e234b78ae4f",
        "hosts",
        hosts.get_host_addresses,
    ),
    Patch(
        "aiortc.rtcsctptransport.decode_params",
        "2ee53946e23f05a348f96053b3fe8b06257597998695ae58a8843a9168191d41",
        "guard",
        sctp_guard.decode_params,
    ),
    Patch(
        "aiortc.rtcsctptransport.parse_packet",
        "b88a5f1d01e14c5f77eea2ef5ab17c7afc7c8ac8d0bae50b6d362d7a46ad9249",
        "guard",
        sctp_guard.parse_packet,
    ),
    Patch(
        "aiortc.rtcdtlstransport.RTCDtlsTransport._RTCDtlsTransport__run",
        "24d63d929a104e16e20d0196590ee21cc41f9d569b134d2779b1d62d876e6815",
        "guard",
        sctp_guard.dtls_run,
    ),
    Patch(
        "aiortc.rtcsctptransport.InboundStream",
        "b63993b481ece97b042cf3528677eba90aca6bdeb240193b4646b57be6ed737f",
        "sctp",
        _R.FastInboundStream,
    ),
    Patch(
        _T + "_send_sack",
        "ac92513522fa60e7f298fd0e5849dd8b9aa9ac969cf840aa653f96c2de690d43",
        "sctp",
        _R._send_sack,
    ),
    Patch(
        _T + "_receive_forward_tsn_chunk",
        "a7b72a09e9c4bb20d2d25dca2563bdeccfb7cb2c35c73009e4a589772c7b7d41",
        "sctp",
        _R._receive_forward_tsn_chunk,
    ),
    Patch(
        _T + "_mark_received",
        "2ac68b6a3934ca87cf9d9383d4dd764a8fbef83c9d06f9a0435bedde7df46499",
        "sctp",
        _R._mark_received,
    ),
    Patch(
        _T + "_handle_data",
        "8661b724e20776bbf9af6f68a828cfb952d2deb617d7a9e0f143d641bdae95e2",
        "sctp",
        _R._handle_data,
    ),
    Patch(
        _T + "_receive_data_chunk",
        "790c2bb8cd0f5dd735cb051ac669ccc5749a25965fb19a6aeb740fc861563048",
        "sctp",
        _R._receive_data_chunk,
    ),
    Patch(
        _T + "__init__",
        "294b0e510843850977697fc56059d70ae4f55e28ed88f1d66046e69e648d2c31",
        "sctp",
        _S._init,
    ),
    Patch(
        _T + "_receive_sack_chunk",
        "4b35ccf1372cdec8705f378a04de43d9c4ad5675afae09781eddd69ecdb473b1",
        "sctp",
        sctp_sack.receive_sack_chunk,
    ),
    Patch(
        _T + "_transmit",
        "aa8941d5f8f020e8b4e438e02084533dd78399da498638a013025252e5fe8115",
        "sctp",
        _S._transmit,
    ),
    Patch(
        _T + "_t3_expired",
        "0e759bf4b1b2d8c8afa3d656a8f34839c974d0104cb66f895a9a9d266f6499af",
        "sctp",
        sctp_timers.t3_expired,
    ),
    Patch(
        _T + "_update_rto",
        "a1e7afb18886a1017f94c777a46cecc5afdc16e31aaaa98690b6f8d795007c99",
        "sctp",
        _S._update_rto,
    ),
    Patch(
        _T + "_update_advanced_peer_ack_point",
        "b10416e34e18a3db286aed5bf4ad6db08a364031250c77ab970f5af97b497ff2",
        "sctp",
        _S._update_advanced_peer_ack_point,
    ),
    Patch(
        _T + "_maybe_abandon",
        "879fcf244b3dfd054834f91f8ca821d015f125faec1a036e97921ff52a422d40",
        "sctp",
    ),
    Patch(
        _T + "_send",
        "f0f8aff63a9a87439230618a25e4e7db919f5001459f06281b4c08724ec395a6",
        "sctp",
    ),
    Patch(
        _T + "_data_channel_flush",
        "d5f055f33db1abff0846e9553f838c9c0703dafee1790835bbf0021af009f8c2",
        "sctp",
    ),
    Patch(
        _T + "_receive_chunk",
        "830bae988365ba89e183334cec6cd47efd03a10909db903e1805d9aad2a5380d",
        "sctp",
    ),
    Patch(
        _T + "_flight_size_decrease",
        "16a9a53b25b96c7c32eb32aba1305ac0b725e8e7d99b38865839c4068ecfb786",
        "sctp",
    ),
    Patch(
        _T + "_flight_size_increase",
        "ed02a0fe6eb506c9bd40e94b191f12e22217ba5aef40c59a001eb7634d80a38c",
        "sctp",
    ),
    Patch(
        _T + "_t3_restart",
        "abf85ae57b8fa1449570f0290f529b57fe181432e65245d1ca9719584320af8d",
        "sctp",
        sctp_timers.t3_restart,
    ),
    Patch(
        _T + "_t3_start",
        "fa045ec7c5fff3d70acdfe21dc70951e4223a8b617cff1a37c1a75b239d9b403",
        "sctp",
        sctp_timers.t3_start,
    ),
    Patch(
        "aioice.ice.StunProtocol.datagram_received",
        "ff4c8b910d45fb3a9e50c4391fe5cbaba33dcba669fea9e847e19a5c99b9bfbb",
        "ice",
        ice.datagram_received,
    ),
    Patch(
        "aioice.ice.StunProtocol.connection_made",
        "dfdd2f61ea4b54d94b112d6009397f05794d1b278ea9e786781cabc52c1bcd4b",
        "ice",
        ice.connection_made,
    ),
    Patch(
        "aioice.ice.Connection.check_start",
        "7de056d252f46a155c8b9c2061077360d2aa6b0dc0ca7f4f5a4fa2fec2417bca",
        "ice",
        ice.check_start,
    ),
    Patch(
        "aioice.ice.Connection.query_consent",
        "fe49173a650a378a4198daa132fe61cbc449974c0011e12db2854dd971367b2e",
        "ice",
        ice.query_consent,
    ),
    Patch(
        "aioice.ice.relayed_candidate",
        "271e25be8724ce381b2bdfe17c1518f314f3588927b34254f5830f98676dcc25",
        "ice",
        ice.relayed_candidate,
    ),
    Patch(
        _D + "_recv_next",
        "998076720c05aa13faadff2dfa337f6964c171fa6791789a72693e1480c74102",
        "dtls",
        dtls.recv_next,
    ),
    Patch(
        _D + "_write_ssl",
        "6573c0237063bdf0df41ede543428ea6e669020e86b93e8484bbac9c9730a54a",
        "dtls",
        dtls.write_ssl,
    ),
    Patch(
        _D + "_send_data",
        "ee6cd411dd7f8eda6da0344f01b98f3c24ae9072cd3ef36d0a0acdd7a618eb47",
        "dtls",
        dtls.send_data,
    ),
    Patch(
        _T + "_send_chunk",
        "eb2f909e3c2ff5cc948062e5eeaee54868455940ea62c6c9162145a4550127e6",
        "dtls",
        compiled_sctp.send_chunk,
    ),
    *(Patch(name, digest, "dtls") for name, digest in _DTLS_RELIED),
    Patch(
        _D + "_do_handshake",
        "0af5299c33352e6e061bf2147281ede4dc7b078665a24d291593483d4b48bdca",
        "handshake",
        handshake.do_handshake,
    ),
    Patch(
        _T + "_t1_start",
        "2fd799f8e120a78c504ce6a5cf7b53feb22022af235cdd9528b7c309e9aa861c",
        "handshake",
        handshake.t1_start,
    ),
    Patch(
        _T + "_t1_expired",
        "6e2dbbf402bd56318870671e6a76dca61713f60c49f2bc2caaafc07ec8a3ba7e",
        "handshake",
        handshake.t1_expired,
    ),
    *(Patch(name, digest, "handshake") for name, digest in _HANDSHAKE_RELIED),
)

# The stock objects, captured before anything is installed: the oracle for tests and the fallback.
ORIGINALS: dict[str, Any] = {p.name: getattr(*_resolve(p.name)) for p in PATCHES}


def versions() -> dict[str, str]:
    return {"aiortc": aiortc.__version__, "aioice": aioice.__version__}


def source_sha256(obj: Any) -> str | None:
    """sha256 of the object's source, or None where no source ships (a frozen bundle)."""
    try:
        return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def verify() -> dict[str, list[str]]:
    """Problems per group (empty lists: the group may be installed)."""
    problems: dict[str, list[str]] = {p.group: [] for p in PATCHES}
    found = versions()
    if found != PINNED:
        for group in VERSIONED_GROUPS:
            problems[group].append(f"written for {PINNED}, found {found}")
    for p in PATCHES:
        digest = source_sha256(ORIGINALS[p.name])
        if digest is None:  # no source to hash (a frozen bundle): the version pin alone vouches for it
            if found != PINNED and p.group not in VERSIONED_GROUPS:
                problems[p.group].append(f"{p.name}: no source to check on {found}")
        elif digest != p.sha256:
            problems[p.group].append(f"{p.name} changed upstream")
    return problems


def install_group(group: str) -> None:
    for p in PATCHES:
        if p.group == group and p.replacement is not None:
            owner, attr = _resolve(p.name)
            setattr(owner, attr, p.replacement)


def uninstall_group(group: str) -> None:
    """Put the stock objects back (tests compare patched and stock peers in one process)."""
    for p in PATCHES:
        if p.group == group and p.replacement is not None:
            owner, attr = _resolve(p.name)
            setattr(owner, attr, ORIGINALS[p.name])
