"""The relay's limits on their own (no server): the frame budget, the failed-authentication
throttle (an injected clock), the bytes of kept answers, and requests nobody waits for."""

from __future__ import annotations

import asyncio
from typing import Any

from kyronix import wire
from kyronix.server.config import TunnelLimits
from kyronix.server.ratelimit import FailureThrottle
from kyronix.server.relay import Peer, Relay
from kyronix.server.relay.peer import FrameBudget, Verdict
from kyronix.server.relay.pending import Requests

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
        relay.forget_waiter(waiter)  # the runtime's connection went away
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
        relay.forget_waiter(waiter)
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
