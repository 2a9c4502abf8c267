"""The synchronous wrapper: the same elector, driven from blocking code."""

from __future__ import annotations

import time

import pytest

from fake import FakeGateway
from fencing_client import ControlClient, NotLeader, SyncElector


def test_a_blocking_leader_writes_while_it_leads_and_not_after_a_pause() -> None:
    fake = FakeGateway()
    with SyncElector(
        "jobs",
        owner="sync",
        ttl_ms=600,
        renew_ms=100,
        margin_ms=60,
        query_timeout_ms=100,
        control=ControlClient(transport=fake.transport()),
        http_transport=fake.transport(),
    ) as leader:
        for _ in range(100):
            if leader.is_leader():
                break
            time.sleep(0.02)
        assert leader.check() == 1
        assert leader.post("/ledger/acct-1/entries", content=b"x").status_code == 200
        assert fake.writes[-1].headers["fencing-token"] == "1"
        # The elector's own thread is paused past the deadline (its loop blocked: no timer, no
        # renewal runs): this thread, asking now, finds no leadership, from the clock alone.
        leader._loop.call_soon_threadsafe(time.sleep, 1.0)
        time.sleep(0.7)
        assert not leader.is_leader()
        with pytest.raises(NotLeader):
            leader.check()
        time.sleep(0.5)
        for _ in range(100):  # it leads again, as a new period
            if leader.is_leader():
                break
            time.sleep(0.02)
        assert leader.check() == 2
        # The store moves on (another owner took the lease) while this thread blocks: the
        # renewal is refused on the elector's own thread, and the next check here says so.
        fake.holder, fake.term = "other#x-0", 3
        time.sleep(0.7)
        assert not leader.is_leader()
        with pytest.raises(NotLeader):
            leader.check()
        sent = len(fake.writes)
        with pytest.raises(NotLeader):
            leader.post("/ledger/acct-1/entries", content=b"y")
        assert len(fake.writes) == sent
