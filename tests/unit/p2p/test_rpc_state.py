"""The RPC endpoint's plain state, driven directly: the waiting requests' order and lookup by id, and a
served stream's credit (what the endpoint tests reach only through whole calls)."""

import asyncio

from engine.p2p.rpc_state import StreamCredit, Waiting, WaitingRequests
from engine.wire import Kind, MessageHead


def waiting(request_id: int, size: int = 10) -> Waiting:
    return Waiting(bytearray(size), MessageHead(Kind.REQUEST, request_id, "m", 0), size)


def test_waiting_requests_start_in_arrival_order_and_forget_each_id_they_hand_out() -> None:
    queue = WaitingRequests()
    for request_id in (5, 3, 9):
        queue.append(waiting(request_id))
    assert len(queue) == 3 and 3 in queue and 4 not in queue
    assert queue.first().head.request_id == 5
    assert queue.pop_first().head.request_id == 5
    assert 5 not in queue and len(queue) == 2
    assert queue.first().head.request_id == 3


def test_a_cancelled_request_leaves_from_the_middle_and_an_unknown_id_changes_nothing() -> None:
    queue = WaitingRequests()
    for request_id in (1, 2, 3):
        queue.append(waiting(request_id, size=request_id * 100))
    assert queue.remove(7) is None and len(queue) == 3
    taken = queue.remove(2)
    assert taken is not None and taken.size == 200
    assert 2 not in queue and queue.remove(2) is None
    assert [queue.pop_first().head.request_id for _ in range(len(queue))] == [1, 3]
    assert not queue


def test_clear_forgets_requests_and_their_ids() -> None:
    queue = WaitingRequests()
    queue.append(waiting(1))
    queue.clear()
    assert len(queue) == 0 and 1 not in queue and queue.remove(1) is None


async def test_stream_credit_waits_while_spent_and_wakes_on_a_grant() -> None:
    credit = StreamCredit(100)
    await asyncio.wait_for(credit.wait(), 1.0)  # positive: no wait
    credit.spend(150)
    assert credit.available == -50
    waiter = asyncio.ensure_future(credit.wait())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    credit.grant(30)  # still not positive: the waiter goes back to sleep
    await asyncio.sleep(0.01)
    assert not waiter.done()
    credit.grant(30)
    await asyncio.wait_for(waiter, 1.0)
    assert credit.available == 10
