"""The dht package's one exception tree. Callers catch the branch they care about::

    DHTError
    ├── CallFailed               one RPC to one node failed (transport error, remote error, bad reply)
    │   └── CallTimeout          no answer within the call's timeout (also a TimeoutError)
    ├── BadRequest               a request or reply that breaks the DHT schema (a remote's fault)
    └── RecordRejected           a record that a store refuses
        ├── BadSignature         not signed by the public key it names (forged or corrupted)
        ├── StaleRecord          not newer than the owner's record already held
        ├── ExpiredRecord        expired, or expiring further ahead than a store accepts
        ├── RecordTooLarge       key, subkey or value over the size limits
        └── QuotaExceeded        the owner, the sender or the key holds as many records as a node keeps

A malformed record (a 31-byte public key, a short signature) is a BadRequest wherever it is read.

Lookups and stores never raise for single-node failures: a failed node is skipped (and evicted from
the routing table after repeated failures), and the result says how many nodes answered.
"""

from __future__ import annotations


class DHTError(Exception):
    """Base of everything the dht package raises."""


class CallFailed(DHTError):
    pass


class CallTimeout(CallFailed, TimeoutError):
    pass


class BadRequest(DHTError):
    pass


class RecordRejected(DHTError):
    pass


class BadSignature(RecordRejected):
    pass


class StaleRecord(RecordRejected):
    pass


class ExpiredRecord(RecordRejected):
    pass


class RecordTooLarge(RecordRejected):
    pass


class QuotaExceeded(RecordRejected):
    pass
