"""Membership against an in-memory gateway."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fake import FakeGateway
from fencing_client import ControlClient, IdentityConflict, Membership, NodeJoined, NodeLeft


def node(fake: FakeGateway, node_id: str, **settings: Any) -> Membership:
    return Membership(
        "workers",
        node_id=node_id,
        interval_ms=100,
        ttl_ms=1000,
        control=ControlClient(transport=fake.transport()),
        **settings,
    )


def test_heartbeats_register_observers_hear_joins_and_leaves_and_a_pause_unregisters() -> None:
    async def main() -> None:
        fake = FakeGateway()
        a = node(fake, "a").start()
        events = a.events()
        joined = await asyncio.wait_for(events.__anext__(), 2)
        assert isinstance(joined, NodeJoined) and joined.node.node_id == "a"
        assert a.is_registered()
        beats = [c for c in fake.calls if c["verb"] == "heartbeat"]
        assert {c["incarnation"] for c in beats} == {a.incarnation}
        b = node(fake, "b").start()
        joined_b = await asyncio.wait_for(events.__anext__(), 2)
        assert isinstance(joined_b, NodeJoined) and joined_b.node.node_id == "b"
        await b.shutdown()
        left = await asyncio.wait_for(events.__anext__(), 2)
        assert left == NodeLeft("b")
        time.sleep(1.0)  # a pause past the registration: no timer ran
        assert not a.is_registered()
        await a.shutdown()

    asyncio.run(main())


def test_a_second_process_with_the_same_node_id_hears_an_identity_conflict() -> None:
    async def main() -> None:
        fake = FakeGateway()
        first = node(fake, "a").start()
        await asyncio.sleep(0.15)
        second = node(fake, "a")
        events = second.events()
        second.start()
        seen = []
        while not any(isinstance(e, IdentityConflict) for e in seen):
            seen.append(await asyncio.wait_for(events.__anext__(), 2))
        assert not second.is_registered()
        assert first.is_registered()
        await second.shutdown()
        await first.shutdown()

    asyncio.run(main())
