"""The daemon runner against an in-memory gateway: what it starts, gives back, drains and cancels."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import httpx

from fake import FakeGateway, problem
from fencing_client import ControlClient, DaemonContext, Daemons, Elector


def runner(fake: FakeGateway, log: List[str], daemon: Any = None) -> Daemons:
    async def default(ctx: DaemonContext) -> None:
        log.append(f"start {ctx.name} {ctx.generation} token {ctx.fencing_token}")
        try:
            while not ctx.is_draining():
                await asyncio.sleep(0.02)
            log.append(f"drained {ctx.name} {ctx.generation}")
        except asyncio.CancelledError:
            log.append(f"cancelled {ctx.name} {ctx.generation}")
            raise

    control = ControlClient(transport=fake.transport())
    elector = Elector("workers-leader", owner="n1", control=control, ttl_ms=1000, renew_ms=200, margin_ms=100, query_timeout_ms=200)
    return Daemons(
        "workers",
        {"d1": daemon or default},
        node_id="n1",
        elector=elector,
        interval_ms=100,
        ttl_ms=1000,
        ack_timeout_ms=1000,
        drain_timeout_ms=1000,
        control=control,
    )


def assigning(generation: int) -> Dict[str, Any]:
    return {"daemon": "d1", "generation": generation, "state": "assigning", "remaining_ms": 1000}


def steps(fake: FakeGateway, verb: str) -> List[Dict[str, Any]]:
    return [c for c in fake.calls if c["verb"] == verb]


def test_a_daemon_starts_only_after_its_acknowledgement_was_accepted() -> None:
    async def main() -> None:
        for refusal in (
            problem(409, "assignment-moved"),
            problem(503, "store-unavailable"),
            httpx.Response(200, json={"daemon": "d1", "generation": 4, "state": "active", "fencing_token": 9}),
            httpx.Response(200, content=b"{"),
        ):
            fake = FakeGateway()
            fake.assignments = [assigning(4)]
            fake.on_ack = lambda daemon, body, refusal=refusal: refusal
            log: List[str] = []
            node = runner(fake, log).start()
            await asyncio.sleep(0.4)
            assert steps(fake, "ack"), "it acknowledged"
            assert log == [], f"started without an accepted acknowledgement ({refusal.status_code}): {log}"
            assert node.running() == []
            await node.shutdown()

    asyncio.run(main())


def test_acknowledged_revoked_and_moved_on() -> None:
    async def main() -> None:
        fake = FakeGateway()
        fake.assignments = [assigning(4)]
        log: List[str] = []
        node = runner(fake, log).start()
        await asyncio.sleep(0.3)
        assert log == ["start d1 4 token 4"] and node.running() == [("d1", 4)]
        # The leader revokes it: it drains, returns, and is given back.
        fake.assignments = [{"daemon": "d1", "generation": 4, "state": "revoking", "remaining_ms": 1000}]
        await asyncio.sleep(0.3)
        assert log[-1] == "drained d1 4"
        assert [c["generation"] for c in steps(fake, "stopped")] == [4]
        # A new generation, then the leader moves it on (gone from the list): cancelled at once,
        # and not given back (it is not this node's any more).
        fake.assignments = [assigning(6)]
        await asyncio.sleep(0.3)
        assert log[-1] == "start d1 6 token 6"
        fake.assignments = []
        await asyncio.sleep(0.3)
        assert log[-1] == "cancelled d1 6"
        assert [c["generation"] for c in steps(fake, "stopped")] == [4]
        # Read as active but not running here (an acknowledgement whose answer was lost): given back.
        fake.assignments = [{"daemon": "d1", "generation": 7, "state": "active", "remaining_ms": None}]
        await asyncio.sleep(0.3)
        assert 7 in [c["generation"] for c in steps(fake, "stopped")]
        assert log[-1] == "cancelled d1 6", "never started"
        await node.shutdown()

    asyncio.run(main())


def test_shutdown_never_gives_back_or_leaves_while_a_daemon_runs() -> None:
    async def main() -> None:
        fake = FakeGateway()
        fake.assignments = [assigning(4)]
        log: List[str] = []
        release = asyncio.Event()

        async def stubborn(ctx: DaemonContext) -> None:
            log.append("start")
            while not release.is_set():
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    log.append("ignored a cancel")

        node = runner(fake, log, stubborn)
        node.drain_timeout_ms = 200  # shutdown's waits, short for the test
        node.start()
        await asyncio.sleep(0.3)
        beats = len(steps(fake, "heartbeat"))
        try:
            await node.shutdown()
            assert "ignored a cancel" in log
            assert len(steps(fake, "heartbeat")) > beats + 1, "it kept heartbeating while the daemon drained"
            assert steps(fake, "stopped") == [] and steps(fake, "leave") == []
        finally:
            release.set()  # however the test ends, the stubborn daemon may go now
            await asyncio.sleep(0.05)

    asyncio.run(main())
