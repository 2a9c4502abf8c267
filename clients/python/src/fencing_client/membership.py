"""Cluster membership over the control API, with the Rust library's semantics.

A node heartbeats its row with an incarnation that is new at every start, so a second process
with the same node id is told ``node-id-in-use`` (:class:`IdentityConflict`) instead of sharing
the row. :meth:`Membership.is_registered` is true while the last accepted heartbeat has not run
out on the local boot clock (its send instant plus the time the store gave it), so a paused
process finds it false when it resumes, before any timer runs. A failed heartbeat is not a leave.
Observers hear joins and leaves from the watch (``GET .../nodes?after=&wait=``); a node that came
back as a new incarnation (a new ``started_at``) is heard leaving, then joining.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Union

from . import _clock
from .control import ControlClient, Node
from .errors import Conflict, FencingError

log = logging.getLogger("fencing_client")


@dataclass(frozen=True)
class NodeJoined:
    node: Node


@dataclass(frozen=True)
class NodeLeft:
    node_id: str


@dataclass(frozen=True)
class IdentityConflict:
    node_id: str


MemberEvent = Union[NodeJoined, NodeLeft, IdentityConflict]


class Membership:
    """One node of ``cluster``: heartbeats every ``interval_ms`` (up to 20% early) with a
    registration ttl of ``ttl_ms`` (at least three intervals), and watches the live nodes."""

    def __init__(
        self,
        cluster: str,
        *,
        control_url: str = "http://127.0.0.1:9090",
        node_id: Optional[str] = None,
        name: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        interval_ms: int = 15_000,
        ttl_ms: Optional[int] = None,
        margin_ms: Optional[int] = None,
        token: Optional[str] = None,
        control: Optional[ControlClient] = None,
    ) -> None:
        self.cluster = cluster
        self.node_id = node_id or f"{socket.gethostname()}-{os.getpid()}"
        self.name = name
        self.metadata = dict(metadata or {})
        self.interval_ms = interval_ms
        self.ttl_ms = ttl_ms if ttl_ms is not None else interval_ms * 6
        self.margin_ms = margin_ms if margin_ms is not None else max(50, self.ttl_ms // 10)
        if interval_ms < 10:
            raise ValueError("interval_ms must be at least 10 ms")
        if self.ttl_ms < 3 * interval_ms:
            raise ValueError("ttl_ms must be at least three heartbeat intervals")
        if self.ttl_ms < 1000:
            raise ValueError("ttl_ms must be at least 1 s over HTTP")
        if not 0 < len(cluster) <= 200 or not 0 < len(self.node_id) <= 200:
            raise ValueError("cluster and node_id must be 1 to 200 characters")
        self.incarnation = secrets.token_hex(8)
        self._pid = os.getpid()
        self._control = control if control is not None else ControlClient(control_url, token=token)
        self._own_control = control is None
        self._registered_until_ns: Optional[int] = None
        self._members: Dict[str, Node] = {}
        self._revision: Optional[int] = None
        self._subscribers: List["asyncio.Queue[MemberEvent]"] = []
        self._stopping = asyncio.Event()
        self._tasks: List["asyncio.Task[None]"] = []

    def start(self) -> "Membership":
        if os.getpid() != self._pid:  # built before a fork: this process is another incarnation
            self._pid, self.incarnation = os.getpid(), secrets.token_hex(8)
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._heartbeats()), loop.create_task(self._watch())]
        return self

    async def __aenter__(self) -> "Membership":
        return self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    def is_registered(self) -> bool:
        until = self._registered_until_ns
        return until is not None and _clock.now_ns() < until

    def members(self) -> List[Node]:
        """The live nodes as last read."""
        return list(self._members.values())

    def events(self) -> AsyncIterator[MemberEvent]:
        queue: "asyncio.Queue[MemberEvent]" = asyncio.Queue()
        self._subscribers.append(queue)

        async def iterate() -> AsyncIterator[MemberEvent]:
            while True:
                yield await queue.get()

        return iterate()

    async def shutdown(self) -> None:
        """Stops heartbeating and leaves now: the others hear ``NodeLeft`` at once."""
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._registered_until_ns = None
        try:
            await self._control.leave(self.cluster, self.node_id, self.incarnation, timeout_s=self.interval_ms / 1000)
        except FencingError as error:
            log.debug("leave of %s/%s: %s", self.cluster, self.node_id, error)
        if self._own_control:
            await self._control.aclose()

    async def _heartbeats(self) -> None:
        while not self._stopping.is_set():
            sent = _clock.now_ns()
            try:
                registration = await self._control.heartbeat(
                    self.cluster,
                    self.node_id,
                    self.incarnation,
                    self.ttl_ms,
                    name=self.name,
                    metadata=self.metadata,
                    timeout_s=self.interval_ms / 1000,
                )
                self._registered_until_ns = (
                    sent + registration.remaining_ms * _clock.NANOS_PER_MS - self.margin_ms * _clock.NANOS_PER_MS
                )
            except Conflict as error:
                if error.kind == "node-id-in-use":
                    self._emit(IdentityConflict(self.node_id))
                log.warning("heartbeat of %s/%s refused: %s", self.cluster, self.node_id, error)
            except FencingError as error:
                log.warning("heartbeat of %s/%s failed: %s", self.cluster, self.node_id, error)
            await asyncio.sleep(self.interval_ms * random.uniform(0.8, 1.0) / 1000)

    async def _watch(self) -> None:
        after = 0
        while not self._stopping.is_set():
            asked = _clock.now_ns()
            try:
                members = await self._control.members(self.cluster, after=after, wait_ms=30_000)
            except FencingError as error:
                log.debug("members of %s: %s", self.cluster, error)
                await asyncio.sleep(min(self.interval_ms, 1000) / 1000)
                continue
            self._apply(members.nodes)
            if members.revision == after and _clock.now_ns() - asked < 1000 * _clock.NANOS_PER_MS:
                # Unchanged, and answered at once instead of waiting: do not ask again at once.
                await asyncio.sleep(min(self.interval_ms, 1000) / 1000)
            after = members.revision

    def _apply(self, nodes: List[Node]) -> None:
        now = {node.node_id: node for node in nodes}
        for node_id, old in list(self._members.items()):
            new = now.get(node_id)
            if new is None or new.started_at != old.started_at:
                self._emit(NodeLeft(node_id))
        for node_id, node in now.items():
            old = self._members.get(node_id)
            if old is None or old.started_at != node.started_at:
                self._emit(NodeJoined(node))
        self._members = now

    def _emit(self, event: MemberEvent) -> None:
        for queue in self._subscribers:
            queue.put_nowait(event)
