"""Routing table: bucket splitting, k-closest against brute force, replacement cache and eviction."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.dht.ids import ID_BITS, distance, peer_id_of_node
from engine.dht.routing import RoutingTable

ids = st.integers(min_value=0, max_value=(1 << ID_BITS) - 1)


def fill(table: RoutingTable, node_ids: list[int]) -> None:
    for n in node_ids:
        table.add(n, peer_id_of_node(n))


def test_buckets_split_near_us_and_tile_the_space() -> None:
    rng = random.Random(1)
    me = rng.getrandbits(ID_BITS)
    table = RoutingTable(me, k=4)
    fill(table, [rng.getrandbits(ID_BITS) for _ in range(500)])
    assert len(table.buckets) > 3
    for b in table.buckets:
        assert len(b.contacts) <= 4
        assert all(b.covers(n) for n in b.contacts)
    # buckets tile the space without gaps
    assert table.buckets[0].lo == 0 and table.buckets[-1].hi == 1 << ID_BITS
    assert all(a.hi == b.lo for a, b in zip(table.buckets, table.buckets[1:], strict=False))
    # far from us nothing splits: the half of the space without our id stays one bucket
    assert sum(1 for b in table.buckets if b.depth == 1) == 1
    assert len(table.buckets) < 4 * 9  # O(log n) buckets for n = 500


def test_full_far_bucket_caches_replacement_and_names_lru() -> None:
    me = 0
    table = RoutingTable(me, k=2)
    far = [(1 << 159) + i for i in range(3)]  # all in the far half, which never splits
    assert table.add(far[0], peer_id_of_node(far[0])) is None
    table.add(1, peer_id_of_node(1))  # splits the root; far half keeps far[0]
    assert table.add(far[1], peer_id_of_node(far[1])) is None
    lru = table.add(far[2], peer_id_of_node(far[2]))
    assert lru == (far[0], peer_id_of_node(far[0]))
    assert far[2] not in table and far[2] in table.bucket_of(far[2]).replacements
    # the LRU fails to answer: evicted, newest replacement promoted
    assert table.remove(far[0])
    assert far[2] in table and far[0] not in table


def test_repeated_failures_evict() -> None:
    table = RoutingTable(0, k=20, max_failures=2)
    table.add(5, peer_id_of_node(5))
    assert not table.record_failure(5)
    table.add(5, peer_id_of_node(5))  # an answer resets the count
    assert not table.record_failure(5)
    assert table.record_failure(5)
    assert 5 not in table and table.evicted == 1


@settings(max_examples=60, deadline=None)
@given(me=ids, others=st.lists(ids, min_size=0, max_size=300, unique=True), target=ids, k=st.integers(1, 25))
def test_nearest_matches_brute_force(me: int, others: list[int], target: int, k: int) -> None:
    table = RoutingTable(me, k=20)
    fill(table, others)
    held = [n for n, _ in table.contacts()]
    assert len(held) == len(set(held))
    got = [n for n, _ in table.nearest(target, k)]
    assert got == sorted(held, key=lambda n: distance(n, target))[:k]


@settings(max_examples=40, deadline=None)
@given(me=ids, others=st.lists(ids, min_size=0, max_size=200, unique=True))
def test_table_keeps_every_contact_near_us(me: int, others: list[int]) -> None:
    """Buckets around our own id split, so our k closest neighbours are never dropped."""
    table = RoutingTable(me, k=8)
    fill(table, others)
    closest = sorted((n for n in others if n != me), key=lambda n: n ^ me)[:8]
    assert [n for n, _ in table.nearest(me, 8)] == closest
