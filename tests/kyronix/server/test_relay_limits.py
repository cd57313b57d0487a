"""The relay's limits on their own (no server): the frame budget, the failed-authentication
throttle (an injected clock), the bytes of kept answers, requests nobody waits for, the bytes in
flight, request ids per key, and rulings waiting for an answer."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from kyronix import wire
from kyronix.server.config import TunnelLimits
from kyronix.server.ratelimit import FailureThrottle
from kyronix.server.relay import Peer, Relay
from kyronix.server.relay import pending as pending_module
from kyronix.server.relay.peer import FrameBudget, Verdict
from kyronix.server.relay.pending import Requests, TunnelFailure
from kyronix.server.relay.rulings import RESOLVE_WAIT_S

READ = '<tool name="read_file" executionId="exec_1"><path>a</path></tool>'


class Socket:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.closed: tuple[int, str | None] | None = None

    async def send_text(self, data: str) -> None:
        self.sent.append(data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.closed = (code, reason)


def test_a_frame_budget_lets_the_burst_through_then_limits_then_closes() -> None:
    budget = FrameBudget(rate=10.0, burst=5.0)
    verdicts = [budget.take(100.0) for _ in range(11)]
    assert verdicts == [Verdict.OK] * 5 + [Verdict.LIMITED] * 5 + [Verdict.CLOSE]
    assert budget.retry_after() > 0
    calm = FrameBudget(rate=10.0, burst=5.0)
    assert all(calm.take(100.0 + n * 0.1) is Verdict.OK for n in range(100))  # at the rate
    told = FrameBudget(rate=1.0, burst=1.0)
    assert told.tell(5.0) and not told.tell(5.5) and told.tell(6.0)  # once a second


def test_a_sender_a_little_over_the_rate_is_closed_not_limited_forever() -> None:
    """Frames dropped for want of tokens fill a bucket that drains at the rate: a sender at three
    times the rate is closed within a few bursts, though a frame gets through now and then (with
    a counter reset by every frame let through, it was never closed). So the server never reads
    more than twice the rate from a connection for long."""
    budget = FrameBudget(rate=10.0, burst=5.0)
    verdicts = [budget.take(100.0 + n / 30) for n in range(200)]
    assert Verdict.CLOSE in verdicts
    closed_at = verdicts.index(Verdict.CLOSE)
    assert Verdict.OK in verdicts[6:closed_at]  # frames got through on the way: still closed
    assert closed_at < 40
    steady = FrameBudget(rate=10.0, burst=5.0)  # a burst, then at the rate: never closed
    assert all(steady.take(100.0) is Verdict.OK for _ in range(5))
    assert all(steady.take(100.0 + n * 0.1) is not Verdict.CLOSE for n in range(1, 300))


def test_a_byte_budget_drops_big_frames_back_to_back_and_refills_at_its_rate() -> None:
    budget = FrameBudget(rate=1000.0, burst=1000.0, byte_rate=100.0, byte_burst=1000.0)
    assert budget.take(10.0, 600) is Verdict.OK
    assert budget.take(10.0, 600) is Verdict.LIMITED  # frames to spare, but not bytes
    assert budget.take(10.0, 300) is Verdict.OK  # a smaller one fits what is left
    assert budget.take(16.0, 600) is Verdict.OK  # 6 s at 100 bytes a second: room again
    flood = FrameBudget(rate=1000.0, burst=10.0, byte_rate=100.0, byte_burst=1000.0)
    verdicts = [flood.take(10.0, 1000) for _ in range(12)]
    assert verdicts == [Verdict.OK] + [Verdict.LIMITED] * 10 + [Verdict.CLOSE]


def test_the_time_spent_reading_frames_is_a_budget_too() -> None:
    """A frame that cost more to read than was left goes through; the frames after it wait
    until the time it overdrew has come back (here 0.5 s of reading a second)."""
    budget = FrameBudget(rate=1000.0, burst=1000.0, parse_rate=0.5, parse_burst=1.0)
    assert budget.take(10.0) is Verdict.OK
    budget.spend(2.0)  # one expensive frame: 1 s left, 2 s spent
    assert budget.take(10.0) is Verdict.LIMITED
    assert budget.retry_after() == pytest.approx(2.0)
    assert budget.take(11.9) is Verdict.LIMITED  # still below zero
    assert budget.take(12.1) is Verdict.OK  # back above it
    cheap = FrameBudget(rate=1000.0, burst=1000.0, parse_rate=0.5, parse_burst=1.0)
    for n in range(100):  # frames that cost little never run out
        assert cheap.take(10.0 + n * 0.01) is Verdict.OK
        cheap.spend(0.001)


def test_a_project_budget_is_shared_by_its_connections_and_charged_to_the_sender() -> None:
    async def scenario() -> None:
        limits = TunnelLimits(project_frames_per_second=1.0, project_frame_burst=4)
        relay = Relay(limits=limits)
        mine = [Peer(Socket(), "runtime", "p1", key_id=f"k{n}") for n in range(3)]
        theirs = Peer(Socket(), "runtime", "p2", key_id="k9")
        for peer in [*mine, theirs]:
            relay.connect(peer)
        got = [relay.admit(mine[n % 3], 50.0, 10) for n in range(6)]
        assert got == [Verdict.OK] * 4 + [Verdict.LIMITED] * 2  # four for all of p1
        assert [p.budget.over for p in mine] == [0, 1, 1]  # the senders of the two paid
        assert relay.admit(theirs, 50.0, 10) is Verdict.OK  # another project is untouched
        verdicts = [relay.admit(mine[2], 50.0, 10) for _ in range(400)]
        assert verdicts[-1] is Verdict.CLOSE  # a connection over its project's share goes
        relay.tidy(60.0)
        assert set(relay.budgets) == {"p1", "p2"}
        for peer in mine:
            relay.detach(peer)
        relay.tidy(61.0)
        assert set(relay.budgets) == {"p2"}  # a project gone from here: its budget too
        await relay.close()

    asyncio.run(scenario())


def test_failures_are_throttled_per_address_and_successes_take_nothing() -> None:
    throttle = FailureThrottle(per_minute=60, burst=3)
    for _ in range(3):
        assert throttle.wait("203.0.113.9", now=10.0) == 0
        throttle.failed("203.0.113.9", now=10.0)
    assert throttle.wait("203.0.113.9", now=10.0) > 0  # this address waits
    assert throttle.wait("198.51.100.7", now=10.0) == 0  # another is untouched
    assert throttle.wait("203.0.113.9", now=11.0) == 0  # a token came back
    assert throttle.wait(None) == 0  # no address: nothing to hold against it


def _result(request_id: str, size: int) -> wire.KmlResult:
    entry: Any = {
        "tool": "read_file",
        "args": {},
        "result": {"success": True, "output": "x" * size, "executionId": "e", "ms": 0},
    }
    return wire.KmlResult(request_id, (entry,))  # fmt: skip


def test_kept_answers_are_bounded_in_bytes_oldest_first_per_project_and_in_all() -> None:
    kept = Requests(kept_bytes=10_000, kept_bytes_project=6_000)
    kept.keep("p1", _result("a", 0), 3_000)
    kept.keep("p1", _result("b", 0), 3_000)
    kept.keep("p1", _result("c", 0), 3_000)  # over p1's 6,000: its oldest goes
    assert kept.kept_answer(("p1", "a")) is None
    assert kept.kept_answer(("p1", "c")) is not None
    kept.keep("p2", _result("d", 0), 5_000)  # over all 10,000: the oldest of all goes
    assert kept.kept_answer(("p1", "b")) is None
    assert kept.kept_size == 8_000
    kept.keep("p2", _result("huge", 0), 7_000)  # alone over a project's bound: never kept
    assert kept.kept_answer(("p2", "huge")) is None
    kept.keep("p1", _result("c", 0), 1_000)  # kept again: counted once
    assert kept.kept_size == 6_000


def test_kept_answers_are_counted_per_project_and_one_project_never_evicts_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pending_module, "KEEP_RESULTS", 3)
    kept = Requests(kept_bytes=10_000_000, kept_bytes_project=10_000_000)
    kept.keep("quiet", _result("q", 0), 10)
    for n in range(50):  # a busy project answers many
        kept.keep("busy", _result(f"b{n}", 0), 10)
    assert kept.kept_answer(("quiet", "q")) is not None  # still there
    assert [k for k in kept.kept if k[0] == "busy"] == [("busy", f"b{n}") for n in (47, 48, 49)]


def _waiter(got: list[Any]) -> Any:
    async def waiter(answer: Any) -> None:
        got.append(answer)

    return waiter


def test_the_bytes_of_requests_in_flight_are_bounded_per_connection_and_project() -> None:
    async def scenario() -> None:
        limits = TunnelLimits(max_pending_bytes=2_000, max_pending_bytes_project=3_000)
        relay = Relay(limits=limits)
        executer = Peer(Socket(), "executer", "p1", "default", key_id="k1")
        first, second = (Peer(Socket(), "runtime", "p1", key_id="k1") for _ in range(2))
        for peer in (executer, first, second):
            relay.connect(peer)
        await relay.attach_executer(executer)
        big = READ + " " * (1_500 - len(READ))
        await relay.request("p1", "a", big, _waiter([]), asker=first)
        with pytest.raises(TunnelFailure, match="maxPendingBytes") as over:
            await relay.request("p1", "b", big, _waiter([]), asker=first)
        assert over.value.code == "too_many_pending"
        small = READ + " " * (1_000 - len(READ))
        await relay.request("p1", "c", small, _waiter([]), asker=second)
        with pytest.raises(TunnelFailure, match="maxPendingBytesPerProject"):  # 1,000 + 1,000
            await relay.request("p1", "d", small, _waiter([]), asker=second)  # is its own 2,000
        assert first.pending_bytes == 1_500 and relay.requests.bytes_by_project["p1"] == 2_500
        assert await relay.result(executer, _result("a", 10), 100)  # answered: room again
        assert first.pending_bytes == 0
        await relay.request("p1", "b", big, _waiter([]), asker=first)
        await relay.close()

    asyncio.run(scenario())


def test_a_request_id_belongs_to_the_key_that_sent_it() -> None:
    """Another key of the project can neither join a request in flight nor read its kept
    answer by sending the same id; the key that sent it can do both."""

    async def scenario() -> None:
        relay = Relay()
        executer = Peer(Socket(), "executer", "p1", "default", key_id="k_exec")
        mine = Peer(Socket(), "runtime", "p1", key_id="k_mine")
        again = Peer(Socket(), "runtime", "p1", key_id="k_mine")  # reconnected
        thief = Peer(Socket(), "runtime", "p1", key_id="k_thief")
        for peer in (executer, mine, again, thief):
            relay.connect(peer)
        await relay.attach_executer(executer)
        got, stolen = [], []
        await relay.request("p1", "req_1", READ, _waiter(got), asker=mine)
        with pytest.raises(TunnelFailure) as refused:
            await relay.request("p1", "req_1", READ, _waiter(stolen), asker=thief)
        assert refused.value.code == "request_in_use"
        await relay.request("p1", "req_1", READ, _waiter(got), asker=again)  # joins
        assert await relay.result(executer, _result("req_1", 10), 100)
        assert len(got) == 2 and not stolen
        with pytest.raises(TunnelFailure, match="another API key"):  # kept: still not theirs
            await relay.request("p1", "req_1", READ, _waiter(stolen), asker=thief)
        await relay.request("p1", "req_1", READ, _waiter(got), asker=again)
        assert len(got) == 3 and not stolen
        await relay.close()

    asyncio.run(scenario())


def test_rulings_waiting_are_bounded_per_connection_and_forgotten_after_a_while() -> None:
    async def scenario() -> None:
        relay = Relay(limits=TunnelLimits(max_pending=2))
        executer = Peer(Socket(), "executer", "p1", "default", key_id="k1")
        runtime = Peer(Socket(), "runtime", "p1", key_id="k1")
        for peer in (executer, runtime):
            relay.connect(peer)
        await relay.attach_executer(executer)
        for n in range(3):
            await relay.resolve(runtime, wire.Resolve(f"exec_{n}", "skipped", f"res_{n}", None))
        assert isinstance(runtime.ws, Socket) and isinstance(executer.ws, Socket)
        told = [json.loads(t) for t in runtime.ws.sent]
        assert [f["code"] for f in told] == ["too_many_pending"]  # the third waits for room
        assert len(executer.ws.sent) == 2 and runtime.resolving == 2
        relay.tidy(time.monotonic() + RESOLVE_WAIT_S + 1)  # nobody answered: forgotten
        assert runtime.resolving == 0 and not relay.rulings.asked
        late = wire.Resolved("exec_0", "skipped", "res_0")
        assert not await relay.resolved(executer, late)  # an answer to nothing now: refused
        await relay.close()

    asyncio.run(scenario())


def test_a_request_nobody_waits_for_is_dropped_and_its_late_answer_refused() -> None:
    async def scenario() -> None:
        relay = Relay(limits=TunnelLimits(orphan_s=0.05))
        executer = Peer(Socket(), "executer", "p1", "default", key_id="k1")
        runtime = Peer(Socket(), "runtime", "p1", key_id="k1")
        for peer in (executer, runtime):
            relay.connect(peer)
        await relay.attach_executer(executer)
        got: list[Any] = []

        async def waiter(answer: Any) -> None:
            got.append(answer)

        await relay.request("p1", "req_1", READ, waiter, asker=runtime)
        assert runtime.pending == 1 and relay.requests.by_project["p1"] == 1
        relay.forget_waiter("p1", "req_1", waiter)  # the runtime's connection went away
        for _ in range(500):
            if not relay.requests.pending:
                break
            await asyncio.sleep(0.01)
        assert not relay.requests.pending
        assert runtime.pending == 0 and relay.requests.by_project["p1"] == 0
        assert not await relay.result(executer, _result("req_1", 10), 100)  # refused
        assert relay.requests.kept_answer(("p1", "req_1")) is None and not got
        # joined again before the timeout, a request is not dropped
        await relay.request("p1", "req_2", READ, waiter, asker=runtime)
        relay.forget_waiter("p1", "req_2", waiter)
        await relay.request("p1", "req_2", READ, waiter, asker=runtime)
        await asyncio.sleep(0.2)
        assert ("p1", "req_2") in relay.requests.pending
        assert await relay.result(executer, _result("req_2", 10), 100)
        assert [a.request_id for a in got] == ["req_2"]
        await relay.close()

    asyncio.run(scenario())


def test_a_revoked_key_closes_every_connection_of_it_and_no_other() -> None:
    async def scenario() -> None:
        relay = Relay()
        mine = [Peer(Socket(), "runtime", "p1", key_id="k1") for _ in range(2)]
        executer = Peer(Socket(), "executer", "p1", "laptop", key_id="k1")
        other = Peer(Socket(), "runtime", "p1", key_id="k2")
        for peer in [*mine, executer, other]:
            relay.connect(peer)
        await relay.attach_executer(executer)
        assert relay.key_ids() == {"k1", "k2"}
        assert await relay.close_key("k1", "the API key was revoked") == 3
        for peer in [*mine, executer]:
            assert isinstance(peer.ws, Socket) and peer.ws.closed is not None
            assert peer.ws.closed == (4401, "the API key was revoked")
        assert not relay.here("p1", "laptop") and relay.key_ids() == {"k2"}
        assert isinstance(other.ws, Socket) and other.ws.closed is None

    asyncio.run(scenario())
