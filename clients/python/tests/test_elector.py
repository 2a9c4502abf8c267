"""The elector against an in-memory gateway: leadership, its end, and bad answers."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, List

import httpx
import pytest

from fake import FakeGateway, problem
from fencing_client import (
    Conflict,
    ControlClient,
    Elected,
    Elector,
    FencedHttp,
    LossReason,
    Lost,
    NotLeader,
    OutcomeUnknown,
    ProtocolError,
    StaleLeader,
    Unavailable,
)

FAST = dict(ttl_ms=600, renew_ms=100, margin_ms=60, query_timeout_ms=100)


def elector(fake: FakeGateway, **settings: Any) -> Elector:
    merged = {**FAST, **settings}
    return Elector("jobs", owner="node-a", control=ControlClient(transport=fake.transport()), **merged)


async def next_event(events: Any, timeout: float = 3.0) -> Any:
    return await asyncio.wait_for(events.__anext__(), timeout)


async def collect(events: Any, seconds: float) -> List[Any]:
    seen: List[Any] = []
    try:
        while True:
            seen.append(await asyncio.wait_for(events.__anext__(), seconds))
    except asyncio.TimeoutError:
        return seen


def record_releases(fake: FakeGateway, order: List[str]) -> None:
    """Appends "released" to ``order`` at each release the fake gateway receives."""
    original = fake.lease

    def lease(key: str, verb: str, body: Any) -> Any:
        if verb == "release":
            order.append("released")
        return original(key, verb, body)

    fake.lease = lease  # type: ignore[method-assign]


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_leads_renews_and_owns_each_period_under_a_fresh_owner() -> None:
    async def main() -> None:
        fake = FakeGateway()
        e = elector(fake)
        events = e.events()
        e.start()
        elected = await next_event(events)
        assert isinstance(elected, Elected) and elected.term == 1
        assert elected.owner == f"node-a#{e.incarnation}-0"
        await asyncio.sleep(0.35)
        assert e.is_leader() and e.current_term() == 1
        assert len(fake.verbs("renew")) >= 2, fake.calls
        await e.shutdown()
        assert not e.is_leader()
        assert fake.verbs("release")[-1]["owner"] == elected.owner
        assert fake.holder is None

    run(main())


def test_a_refused_renewal_ends_the_period_cancels_its_work_and_the_next_period_is_new() -> None:
    async def main() -> None:
        fake = FakeGateway()
        e = elector(fake)
        events = e.events()
        cancelled = asyncio.Event()

        async def work(leadership: Any) -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        e.spawn_leader_work(work)
        e.start()
        first = await next_event(events)
        # Someone else took the lease (the store's view): the renewal is refused.
        fake.holder = "node-b#x-0"
        fake.term = 2
        lost = await next_event(events)
        assert isinstance(lost, Lost) and lost.term == 1 and lost.reason == LossReason.RENEW_REFUSED
        await asyncio.wait_for(cancelled.wait(), 1)
        assert not e.is_leader()
        fake.holder = None
        again = await next_event(events)
        assert isinstance(again, Elected) and again.term == 3
        assert again.owner != first.owner, "a period ended locally is over: a new owner, a new term"
        owners = [c["owner"] for c in fake.verbs("acquire")]
        assert owners.index(again.owner) > owners.index(first.owner)
        assert first.owner not in owners[owners.index(again.owner):]
        await e.shutdown()

    run(main())


def test_a_renewal_that_never_answers_ends_the_period_by_the_deadline() -> None:
    async def main() -> None:
        fake = FakeGateway()
        stall = asyncio.Event()

        async def slow(_: Any) -> Any:
            await stall.wait()
            return None

        e = elector(fake)
        events = e.events()
        e.start()
        await next_event(events)
        fake.on_renew = slow
        lost = await next_event(events, 2)
        assert isinstance(lost, Lost) and lost.reason in (LossReason.RENEW_FAILED, LossReason.DEADLINE)
        assert not e.is_leader()
        stall.set()
        await e.shutdown()

    run(main())


def test_a_paused_process_is_not_leader_before_any_timer_runs() -> None:
    async def main() -> None:
        fake = FakeGateway()
        e = elector(fake, renew_ms=150)
        events = e.events()
        e.start()
        await next_event(events)
        leadership = e.leadership()
        assert leadership.check() == 1
        # A pause past the lease: the event loop is blocked, no timer or task runs.
        time.sleep(0.7)
        assert not e.is_leader(), "is_leader reads the clock at the moment of asking"
        with pytest.raises(NotLeader):
            leadership.check()
        sent = len(fake.writes)
        async with FencedHttp(e, transport=fake.transport()) as http:
            with pytest.raises(NotLeader):
                await http.post("/ledger/acct-1/entries", json_body={"n": 1})
        assert len(fake.writes) == sent, "nothing was sent"
        lost = await next_event(events)
        assert isinstance(lost, Lost) and lost.reason == LossReason.DEADLINE
        await e.shutdown()

    run(main())


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, content=b"{not json"),
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json={"key": "jobs", "owner": "x", "term": 1, "remaining_ms": 500, "ttl_ms": 600}),
        "other-key",
        "remaining-above-ttl",
        "another-ttl",
        "missing-term",
        "zero-term",
        "bool-term",
        "string-remaining",
        httpx.Response(500, content=b"oops"),
        httpx.Response(302, headers={"location": "http://example.invalid/"}),
        httpx.Response(503, headers={"content-type": "application/problem+json"}, content=b"{"),
        "slow",
    ],
)
def test_an_answer_it_does_not_understand_is_never_leadership(answer: Any) -> None:
    async def main() -> None:
        fake = FakeGateway()

        async def respond(body: Any) -> Any:
            good = {"key": "jobs", "owner": body["owner"], "term": 1, "remaining_ms": 500, "ttl_ms": 600}
            if answer == "other-key":
                good["key"] = "other"
            elif answer == "remaining-above-ttl":
                good["remaining_ms"] = 10**9
            elif answer == "another-ttl":
                good["ttl_ms"] = 10**9
            elif answer == "missing-term":
                del good["term"]
            elif answer == "zero-term":
                good["term"] = 0
            elif answer == "bool-term":
                good["term"] = True
            elif answer == "string-remaining":
                good["remaining_ms"] = "500"
            elif answer == "slow":
                await asyncio.sleep(1)
            else:
                return answer
            return httpx.Response(200, json=good)

        fake.on_acquire = respond
        e = elector(fake)
        events = e.events()
        e.start()
        # Longer than the slow answer takes: without the call's bound it would be a grant.
        seen = await collect(events, 1.5 if answer == "slow" else 0.5)
        assert seen == [] and not e.is_leader() and e.current_term() is None
        assert len(fake.verbs("acquire")) >= 1
        await e.shutdown()

    run(main())


def test_the_control_client_says_what_was_wrong() -> None:
    async def main() -> None:
        fake = FakeGateway()
        control = ControlClient(transport=fake.transport())
        fake.on_acquire = lambda body: httpx.Response(200, content=b"<html>")
        with pytest.raises(ProtocolError, match="not JSON"):
            await control.acquire("jobs", "a", 1000)
        fake.on_acquire = lambda body: httpx.Response(500, content=b"boom")
        with pytest.raises(ProtocolError, match="unexpected status 500"):
            await control.acquire("jobs", "a", 1000)

        async def slow(body: Any) -> Any:
            await asyncio.sleep(1)

        fake.on_acquire = slow
        with pytest.raises(Unavailable, match="no answer within"):
            await control.acquire("jobs", "a", 1000, timeout_s=0.05)
        await control.aclose()

    run(main())


def test_a_fenced_write_refused_with_409_raises_stale_leader_and_ends_the_period() -> None:
    async def main() -> None:
        fake = FakeGateway()
        e = elector(fake)
        events = e.events()
        e.start()
        await next_event(events)
        http = FencedHttp(e, transport=fake.transport())
        ok = await http.post("/ledger/acct-1/entries", json_body={"n": 1})
        assert ok.status_code == 200
        assert fake.writes[-1].headers["fencing-token"] == "1"
        fake.on_write = lambda request: problem(
            409, "stale-term", resource="acct-1", presented_term=1, current_term=4
        )
        with pytest.raises(StaleLeader) as refused:
            await http.post("/ledger/acct-1/entries", json_body={"n": 2})
        assert refused.value.kind == "stale-term" and refused.value.current_term == 4
        assert refused.value.problem["resource"] == "acct-1"
        lost = await next_event(events)
        assert isinstance(lost, Lost) and lost.reason == LossReason.FENCED
        assert not e.is_leader()
        # An upstream's own 409 (not a fence's problem) is the upstream's answer, not a refusal.
        fake.on_write = lambda request: httpx.Response(409, json={"error": "duplicate"})
        await next_event(events)  # elected again, a new period
        answer = await http.post("/ledger/acct-1/entries", json_body={"n": 3})
        assert answer.status_code == 409 and e.is_leader()
        await http.aclose()
        await e.shutdown()

    run(main())


def test_stamp_mode_presents_the_lease_and_the_periods_owner() -> None:
    async def main() -> None:
        fake = FakeGateway()
        e = elector(fake)
        events = e.events()
        e.start()
        elected = await next_event(events)
        async with FencedHttp(e, mode="stamp", transport=fake.transport()) as http:
            await http.put("/jobs/x", resource="job-7", content=b"x")
        sent = fake.writes[-1]
        assert sent.headers["fencing-lease"] == "jobs"
        assert sent.headers["fencing-owner"] == elected.owner
        assert sent.headers["fencing-resource"] == "job-7"
        assert "fencing-token" not in sent.headers
        await e.shutdown()

    run(main())


def test_a_write_in_flight_when_the_period_ends_is_outcome_unknown() -> None:
    async def main() -> None:
        fake = FakeGateway()
        e = elector(fake)
        events = e.events()
        e.start()
        await next_event(events)

        order: List[str] = []

        async def hang_until_cancelled(request: Any) -> Any:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                await asyncio.sleep(0.05)  # a send that takes a moment to stop
                order.append("write cancelled")
                raise

        record_releases(fake, order)
        fake.on_write = hang_until_cancelled
        fake.holder = "someone-else"  # the next renewal is refused
        async with FencedHttp(e, transport=fake.transport()) as http:
            with pytest.raises(OutcomeUnknown):
                await asyncio.wait_for(http.post("/ledger/acct-1/entries", content=b"x"), 3)
        await asyncio.sleep(0.1)
        # The write of the ended period was stopped before the lease was released under it.
        assert order[:2] == ["write cancelled", "released"], order
        await e.shutdown()

    run(main())


def test_shutdown_drains_leader_work_before_it_releases_and_keeps_the_lease_when_work_overruns() -> None:
    async def main() -> None:
        fake = FakeGateway()
        e = elector(fake, shutdown_grace_ms=200)
        events = e.events()
        order: List[str] = []

        async def polite(leadership: Any) -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                await asyncio.sleep(0.05)
                order.append("work stopped")
                raise

        e.spawn_leader_work(polite)
        e.start()
        await next_event(events)
        record_releases(fake, order)
        await e.shutdown()
        assert order == ["work stopped", "released"]

        stubborn_fake = FakeGateway()
        s = elector(stubborn_fake, shutdown_grace_ms=100)
        s_events = s.events()

        give_up = asyncio.Event()

        async def stubborn(leadership: Any) -> None:
            while not give_up.is_set():
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    continue  # ignores cancellation: the lease must not be released under it

        s.spawn_leader_work(stubborn)
        s.start()
        await next_event(s_events)
        await s.shutdown()
        assert stubborn_fake.verbs("release") == []
        give_up.set()
        for task in list(s._tasks):
            task.cancel()

    run(main())


def test_a_requested_handover_ends_the_period_and_releases() -> None:
    async def main() -> None:
        fake = FakeGateway()

        def resign(body: Any) -> Any:
            answer = fake.lease("jobs", "renew", body)
            data = json.loads(answer.content)
            data["resign_requested"] = True
            return httpx.Response(200, json=data)

        e = elector(fake)
        events = e.events()
        order: List[str] = []

        async def work(leadership: Any) -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                await asyncio.sleep(0.05)
                order.append("work stopped")
                raise

        record_releases(fake, order)
        e.spawn_leader_work(work)
        e.start()
        await next_event(events)
        fake.on_renew = resign
        lost = await next_event(events)
        assert isinstance(lost, Lost) and lost.reason == LossReason.RESIGNED
        acquires = len(fake.verbs("acquire"))
        await asyncio.sleep(0.4)
        assert order == ["work stopped", "released"], order
        assert fake.holder is None
        assert len(fake.verbs("acquire")) == acquires, "it waits a ttl before it tries to lead again"
        await e.shutdown()

    run(main())


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(ttl_ms=50), "ttl_ms"),
        (dict(margin_ms=300), "margin_ms"),
        (dict(margin_ms=10), "margin_ms"),
        (dict(renew_ms=5), "renew_ms"),
        (dict(renew_ms=400, query_timeout_ms=200), "two thirds"),
        (dict(retry_ms=5000), "retry_ms"),
        (dict(shutdown_grace_ms=0), "shutdown_grace_ms"),
    ],
)
def test_settings_that_cannot_be_safe_are_refused(settings: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        elector(FakeGateway(), **settings)
    with pytest.raises(ValueError, match="owner"):
        Elector("jobs", owner="a#b")


def test_a_leaders_value_is_watched_and_a_zombie_cannot_set_one() -> None:
    async def main() -> None:
        fake = FakeGateway()
        control = ControlClient(transport=fake.transport())
        changes = control.watch_lease("jobs", wait_ms=200)
        assert (await changes.__anext__())["revision"] == 0  # nobody acquired it yet
        e = elector(fake)
        events = e.events()
        e.start()
        await next_event(events)
        held = await asyncio.wait_for(changes.__anext__(), 2)
        assert (held["term"], held["value"]) == (1, None)
        await e.set_value({"addr": "10.0.0.5:8080"})
        changed = await asyncio.wait_for(changes.__anext__(), 2)
        assert changed["value"] == {"addr": "10.0.0.5:8080"} and changed["revision"] > held["revision"]
        # The store moved on: the old holder's value is refused, and it is told it does not lead.
        fake.holder, fake.term = "node-b#x-0", 2
        with pytest.raises(NotLeader):
            await e.set_value({"addr": "stale"})
        assert fake.value == {"addr": "10.0.0.5:8080"}
        await changes.aclose()
        await control.aclose()
        await e.shutdown()

    run(main())


def test_the_deadline_counts_from_the_send_minus_the_margin() -> None:
    async def main() -> None:
        fake = FakeGateway()

        # A grant answered 30 ms after it was sent, with 600 ms left: the deadline is the send
        # plus 600 ms minus the 60 ms margin, so at most 510 ms are left once it is answered.
        async def grant_late(body: Any) -> Any:
            await asyncio.sleep(0.03)
            return None

        fake.on_acquire = grant_late
        fake.on_renew = lambda body: asyncio.sleep(60)  # renewals never answer
        e = elector(fake)
        events = e.events()
        e.start()
        await next_event(events)
        left = e.leadership().remaining_s()
        assert left <= 0.51, f"{left} s left: counted from the answer, or without the margin"
        lost = await next_event(events)
        assert isinstance(lost, Lost)
        await e.shutdown()

    run(main())


def test_a_failure_nobody_expected_ends_the_period_and_the_elector_leads_again() -> None:
    async def main() -> None:
        fake = FakeGateway()
        e = elector(fake)
        events = e.events()
        cancelled = asyncio.Event()

        async def work(leadership: Any) -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        e.spawn_leader_work(work)
        e.start()
        await next_event(events)
        deep = b"[" * 100_000 + b"]" * 100_000  # json.loads raises RecursionError
        fake.on_renew = lambda body: httpx.Response(200, content=deep)
        lost = await next_event(events)
        assert isinstance(lost, Lost) and lost.reason == LossReason.RENEW_FAILED
        await asyncio.wait_for(cancelled.wait(), 1)
        fake.on_renew = None
        fake.holder = None
        again = await next_event(events)
        assert isinstance(again, Elected) and again.term == 2
        await e.shutdown()

    run(main())


def test_a_grant_with_a_term_it_already_had_is_not_leadership() -> None:
    async def main() -> None:
        fake = FakeGateway()
        e = elector(fake)
        events = e.events()
        e.start()
        await next_event(events)
        fake.holder = "someone-else"
        await next_event(events)  # lost
        # The store went back: every grant is term 1 again.
        fake.on_acquire = lambda body: httpx.Response(
            200, json={"key": "jobs", "owner": body["owner"], "term": 1, "remaining_ms": 600, "ttl_ms": 600}
        )
        releases = len(fake.verbs("release"))
        assert await collect(events, 0.5) == []
        assert not e.is_leader()
        assert len(fake.verbs("release")) > releases, "the grant it will not use is released"
        await e.shutdown()

    run(main())


def test_a_forked_child_is_another_owner() -> None:
    e = Elector("jobs", owner="web", control=ControlClient(transport=FakeGateway().transport()))
    parent = e.owner
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its owner and leave at once
        os.write(write, e.owner.encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 200).decode()
    os.waitpid(pid, 0)
    assert child != parent and child.startswith("web#") and e.owner == parent


def test_a_handover_request_says_what_was_asked_and_a_refusal_is_a_conflict() -> None:
    async def main() -> None:
        seen: List[Any] = []

        async def handle(request: httpx.Request) -> httpx.Response:
            seen.append(json.loads(request.content))
            if len(seen) == 1:
                return httpx.Response(202, json={"key": "jobs", "term": 3, "successor": "b", "outcome": "requested"})
            return problem(409, "not-held")

        control = ControlClient(transport=httpx.MockTransport(handle))
        answer = await control.request_resign("jobs", "deploy", successor="b")
        assert answer["outcome"] == "requested" and seen[0] == {"reason": "deploy", "successor": "b"}
        with pytest.raises(Conflict) as refused:
            await control.request_resign("jobs", "deploy")
        assert refused.value.kind == "not-held"
        await control.aclose()

    run(main())
