"""Kademlia DHT: where experts are declared and found. Signed, expiring, replicated records.

Layers, top down (each imports only those below it)::

    experts      facade: declare_experts / get_experts / first_k_active, Declarer (re-declares),
      │            declarations (who declared what, and whether the coordinator's proof holds)
      │            keys: uid -> (key, subkey) slots, assignment proofs, pure
      ▼
    node         DHTNode: bootstrap, find_node, store (k replicas), get (union, verified), upkeep
      ▼
    protocol     dht.ping / dht.store / dht.find_node / dht.find_value, served and called
      │            storage: key -> {slot -> record}, expiry and quotas (per owner, sender, key)
      │            records: signed record, sign/verify/encode (pure)
      ▼
    traversal    iterative lookup, alpha requests in flight, hop counting
      ▼
    routing      k-buckets with splitting, replacement cache, ping-before-evict, k-closest
                   ids: 160-bit node ids (peer ids), key ids (SHA-256), XOR distance

    transport    DHTTransport: the seam under protocol
                   memory: MemoryNetwork, thousands of nodes in one process (delay, loss, dead nodes)
                   p2p_transport: PeerTransport over engine.p2p.Peer (sender = authenticated peer id)
    swarm        make_swarm / join: many nodes on one MemoryNetwork (tests, benchmarks/dht_scale.py)

Exceptions (drawn in ``errors``)::

    DHTError
    ├── CallFailed ── CallTimeout
    ├── BadRequest
    └── RecordRejected ── BadSignature, StaleRecord, ExpiredRecord, RecordTooLarge, QuotaExceeded

Outside the package: ``p2p_transport`` runs on engine.p2p's Peer and, as ``memory`` does, sends
engine.wire's messages; ``records``, ``keys`` and ``swarm`` use engine.p2p's identity (signing,
verifying, peer ids), and ``keys`` the bytes the coordinator signs (engine.wire.statements).

May import: engine.p2p, engine.wire
"""

from .errors import (
    BadRequest,
    BadSignature,
    CallFailed,
    CallTimeout,
    DHTError,
    ExpiredRecord,
    QuotaExceeded,
    RecordRejected,
    RecordTooLarge,
    StaleRecord,
)
from .experts import (
    AssignmentProof,
    Declared,
    Declarer,
    ExpertInfo,
    declarations,
    declare_experts,
    first_k_active,
    get_active_successors,
    get_experts,
)
from .ids import key_id_of, node_id_of
from .memory import MemoryNetwork, MemoryTransport
from .node import DHTNode, GetResult, StoreResult
from .records import Record, sign_record, verify_record
from .transport import DHTTransport

__all__ = [
    "AssignmentProof",
    "BadRequest",
    "BadSignature",
    "CallFailed",
    "CallTimeout",
    "DHTError",
    "DHTNode",
    "DHTTransport",
    "Declared",
    "Declarer",
    "ExpertInfo",
    "ExpiredRecord",
    "GetResult",
    "MemoryNetwork",
    "MemoryTransport",
    "QuotaExceeded",
    "Record",
    "RecordRejected",
    "RecordTooLarge",
    "StaleRecord",
    "StoreResult",
    "declarations",
    "declare_experts",
    "first_k_active",
    "get_active_successors",
    "get_experts",
    "key_id_of",
    "node_id_of",
    "sign_record",
    "verify_record",
]
