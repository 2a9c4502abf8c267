"""Daemons: named background work units run on the live nodes of a cluster, each on one node at a
time, with the Rust library's rules (docs/election.md, "Daemons"; docs/CONTRACT.md).

Every process is a node of the cluster and a candidate for its leader. Once per heartbeat it
heartbeats, runs the leader's pass (``reconcile``) while it holds the cluster's lease, and reads
its own assignments:

- ``assigning``: acknowledge, and start the daemon only after a 200 (a 409 or no answer: do not);
- ``active`` but not running here (an acknowledgement whose answer was lost): give it back;
- ``revoking``: tell the daemon to drain (``ctx.draining``), and cancel it half a heartbeat
  before the drain deadline, counted from the first read that may have returned the revocation;
- gone from the list, or another generation: cancel it at once (the leader moved it on).

A watchdog cancels every daemon half a heartbeat before the node's own registration runs out (its
last accepted heartbeat's send instant plus the store's ``remaining_ms``, on the boot clock), so a
paused or cut-off node stops its daemons before the leader may give them to another node. A
daemon's writes carry ``ctx.fencing_token`` (its generation), so a late write of an older
instance is refused once a newer one wrote.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Set, Tuple

from . import _clock
from .control import Assignment, ControlClient, DaemonsApi
from .elector import Elector, LossReason
from .errors import Conflict, FencingError

log = logging.getLogger("fencing_client")
MS = _clock.NANOS_PER_MS


class DaemonContext:
    """What a running daemon instance knows: its name, generation and fencing token, whether it
    must drain (a revocation, shutdown), and whether it may still act right now."""

    def __init__(self, name: str, generation: int, fencing_token: int, runner: "Daemons") -> None:
        self.name = name
        self.generation = generation
        self.fencing_token = fencing_token
        self.draining = asyncio.Event()
        self._runner = runner
        self._cancelled = False
        self._drain_deadline_ns: Optional[int] = None

    def is_valid(self) -> bool:
        """True while this instance may act: not cancelled, not past its drain deadline, and its
        node's registration has not run out (all read now, on the boot clock)."""
        if self._cancelled:
            return False
        now = _clock.now_ns()
        if self._drain_deadline_ns is not None and now >= self._drain_deadline_ns:
            return False
        return self._runner._registered(now + self._runner.interval_ms * MS // 2)

    def is_draining(self) -> bool:
        return self.draining.is_set()


@dataclass
class _Running:
    ctx: DaemonContext
    task: "asyncio.Task[None]"
    revoked: bool = False
    stopped_sent: bool = False


DaemonFn = Callable[[DaemonContext], Awaitable[Any]]


class Daemons:
    """Runs ``daemons`` (name -> ``async def daemon(ctx)``) as a node of ``cluster``, with
    ``elector`` (default: lease ``<cluster>-leader``) for the leader's pass."""

    def __init__(
        self,
        cluster: str,
        daemons: Mapping[str, DaemonFn],
        *,
        control_url: str = "http://127.0.0.1:9090",
        token: Optional[str] = None,
        node_id: Optional[str] = None,
        elector: Optional[Elector] = None,
        interval_ms: int = 15_000,
        ttl_ms: Optional[int] = None,
        ack_timeout_ms: int = 30_000,
        drain_timeout_ms: int = 60_000,
        control: Optional[ControlClient] = None,
    ) -> None:
        self.cluster = cluster
        self.node_id = node_id or f"{socket.gethostname()}-{os.getpid()}"
        self.interval_ms = interval_ms
        self.ttl_ms = ttl_ms if ttl_ms is not None else interval_ms * 6
        self.ack_timeout_ms = ack_timeout_ms
        self.drain_timeout_ms = drain_timeout_ms
        for name, value in (("interval_ms", interval_ms), ("ttl_ms", self.ttl_ms), ("ack_timeout_ms", ack_timeout_ms), ("drain_timeout_ms", drain_timeout_ms)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer number of milliseconds")
        if not daemons or len(daemons) > 100 or any(not 0 < len(name) <= 200 for name in daemons):
            raise ValueError("daemons: 1 to 100 names of 1 to 200 characters")
        if interval_ms < 10 or self.ttl_ms < 3 * interval_ms or self.ttl_ms < 1000:
            raise ValueError("interval_ms at least 10 ms, ttl_ms at least three intervals and 1 s")
        for name, value in (("ack_timeout_ms", ack_timeout_ms), ("drain_timeout_ms", drain_timeout_ms)):
            if value < 2 * interval_ms or not 1000 <= value <= 3_600_000:
                raise ValueError(f"{name} must be at least two heartbeat intervals, and 1 s to 1 h")
        self._control = control if control is not None else ControlClient(control_url, token=token)
        self._own_control = control is None
        self.incarnation = secrets.token_hex(8)
        self._pid = os.getpid()
        self._api = DaemonsApi(self._control, cluster, self.node_id, self.incarnation)
        self._daemons = dict(daemons)
        self.elector = (
            elector
            if elector is not None
            else Elector(f"{cluster}-leader", control=self._control, ttl_ms=max(2 * interval_ms, 10_000))
        )
        if self.elector.ttl_ms < 2 * interval_ms:
            raise ValueError("the leader's lease must be at least two heartbeat intervals")
        self._registered_until_ns: Optional[int] = None
        self._running: Dict[str, _Running] = {}
        self._first_unanswered_ns: Optional[int] = None
        self._stopping = asyncio.Event()
        self._closing = False
        self._tasks: List["asyncio.Task[None]"] = []
        self._pending: Set["asyncio.Task[None]"] = set()

    # The public surface

    def start(self) -> "Daemons":
        if os.getpid() != self._pid:  # built before a fork: this process is another incarnation
            self._pid, self.incarnation = os.getpid(), secrets.token_hex(8)
            self._api = DaemonsApi(self._control, self.cluster, self.node_id, self.incarnation)
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self.elector.start()
            self._tasks = [
                loop.create_task(self._guard("heartbeats", self._heartbeats())),
                loop.create_task(self._guard("loop", self._loop())),
                loop.create_task(self._guard("watchdog", self._watchdog())),
            ]
        return self

    async def __aenter__(self) -> "Daemons":
        return self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    def running(self) -> List[Tuple[str, int]]:
        """The daemons running here: name and generation."""
        return sorted((name, r.ctx.generation) for name, r in self._running.items() if not r.task.done())

    def is_registered(self) -> bool:
        return self._registered(_clock.now_ns())

    async def shutdown(self) -> None:
        """Releases the lease, drains the daemons (at most the drain timeout, then cancels them),
        gives back the ones that returned, and leaves the cluster once none runs. Heartbeats and
        the watchdog go on until then, so a daemon draining here is never given to another node
        meanwhile, and one that overruns its deadlines is still cancelled."""
        self._closing = True  # no more acknowledgements, starts or leader passes
        try:
            await self.elector.shutdown()
        except Exception as error:  # noqa: BLE001: shutdown goes on
            log.error("the elector of %s ended with %r", self.cluster, error)
        for running in self._running.values():
            running.ctx.draining.set()
        tasks = [r.task for r in self._running.values() if not r.task.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.drain_timeout_ms / 1000)
            for running in list(self._running.values()):
                if running.task in pending:
                    self._cancel(running)
            if pending:
                await asyncio.wait(pending, timeout=self.drain_timeout_ms / 1000)
        still = [name for name, r in self._running.items() if not r.task.done()]
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=self.interval_ms / 1000)
        for name, running in list(self._running.items()):
            if running.task.done():
                await self._give_back(name, running)
        if still:
            # Never given back and never left while running: the registration runs out at its ttl
            # (their is_valid() turns false then), and only then may another node run them.
            log.error("daemons %s of %s ignored their cancellation: not leaving", still, self.cluster)
        else:
            try:
                await self._control.leave(self.cluster, self.node_id, self.incarnation, timeout_s=self.interval_ms / 1000)
            except FencingError as error:
                log.debug("leave of %s/%s: %s", self.cluster, self.node_id, error)
            self._registered_until_ns = None
        if self._own_control:
            await self._control.aclose()

    # The loop

    def _registered(self, now_ns: int) -> bool:
        until = self._registered_until_ns
        return until is not None and now_ns < until

    async def _heartbeats(self) -> None:
        """The node's registration, on its own schedule: a slow leader pass or a batch of
        acknowledgements never delays it."""
        while not self._stopping.is_set():
            sent = _clock.now_ns()
            try:
                registration = await self._control.heartbeat(
                    self.cluster, self.node_id, self.incarnation, self.ttl_ms, timeout_s=self.interval_ms / 1000
                )
                self._registered_until_ns = sent + registration.remaining_ms * MS
            except FencingError as error:
                log.warning("heartbeat of %s/%s: %s", self.cluster, self.node_id, error)
            await asyncio.sleep(self.interval_ms * random.uniform(0.8, 1.0) / 1000)

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            started = _clock.now_ns()
            limit = self.interval_ms / 1000
            if not self._closing:
                await self._leader_pass(limit)
            await self._read_assignments(limit)
            spent = (_clock.now_ns() - started) / 1e9
            await asyncio.sleep(max(0.0, self.interval_ms * random.uniform(0.8, 1.0) / 1000 - spent))

    async def _guard(self, what: str, loop: Awaitable[None]) -> None:
        """Runs one of the runner's loops; if it fails (nobody expected it to), the node gives up
        rather than run daemons without it: it steps down and cancels every daemon."""
        try:
            await loop
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("the daemons' %s of %s failed: cancelling every daemon", what, self.cluster)
            self._closing = True
            self.elector.step_down(LossReason.RENEW_FAILED)
            self._registered_until_ns = None
            for running in list(self._running.values()):
                self._cancel(running)

    async def _leader_pass(self, limit: float) -> None:
        try:
            period = self.elector.leadership()
        except FencingError:
            return
        call = self._api.reconcile(
            self.elector.key,
            period.owner,
            period.term,
            self.ack_timeout_ms,
            self.drain_timeout_ms,
            timeout_s=min(limit, period.remaining_s()),
        )
        try:
            await period.run(call)  # work of the period: gone before its lease is released
        except FencingError as error:
            log.warning("the leader's pass of %s: %s", self.cluster, error)

    async def _read_assignments(self, limit: float) -> None:
        sent = _clock.now_ns()
        try:
            assignments = await self._api.assignments(sorted(self._daemons), timeout_s=limit)
        except FencingError as error:
            # The store may have counted this read as the one that returned a revocation.
            if self._first_unanswered_ns is None:
                self._first_unanswered_ns = sent
            log.warning("assignments of %s/%s: %s", self.cluster, self.node_id, error)
            return
        counted_from = self._first_unanswered_ns if self._first_unanswered_ns is not None else sent
        self._first_unanswered_ns = None
        seen: Dict[str, Assignment] = {a.daemon: a for a in assignments}
        for name, running in list(self._running.items()):
            assignment = seen.get(name)
            if assignment is None or assignment.generation != running.ctx.generation:
                log.warning("daemon %s generation %d moved on: cancelled", name, running.ctx.generation)
                running.stopped_sent = True  # nothing to give back: it is not this node's any more
                self._cancel(running)
        for assignment in assignments:
            await self._act(assignment, counted_from, limit)

    async def _act(self, assignment: Assignment, counted_from: int, limit: float) -> None:
        name, generation = assignment.daemon, assignment.generation
        running = self._running.get(name)
        mine = running is not None and running.ctx.generation == generation
        if assignment.state == "assigning" and running is None and name in self._daemons and not self._closing:
            try:
                token = await self._api.ack(name, generation, timeout_s=limit)
            except FencingError as error:
                log.warning("ack of %s generation %d: %s: not started", name, generation, error)
                return
            if self._closing or not self.is_registered():
                return  # read as active next time, not run: given back then
            self._start(name, generation, token)
        elif assignment.state == "active" and not mine and running is None:
            await self._stopped(name, generation, limit)
        elif assignment.state == "revoking":
            if mine and running is not None:
                if not running.revoked:
                    running.revoked = True
                    remaining = assignment.remaining_ms or 0
                    running.ctx._drain_deadline_ns = counted_from + remaining * MS - self.interval_ms * MS // 2
                    running.ctx.draining.set()
            elif running is None:
                await self._stopped(name, generation, limit)

    def _start(self, name: str, generation: int, token: int) -> None:
        ctx = DaemonContext(name, generation, token, self)
        work = self._daemons[name]

        async def run() -> None:
            try:
                await work(ctx)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001: a daemon's failure ends that daemon only
                log.exception("daemon %s generation %d failed", name, generation)

        task = asyncio.get_running_loop().create_task(run(), name=f"daemon {name}")
        running = _Running(ctx, task)
        self._running[name] = running
        task.add_done_callback(lambda _: self._track(self._finished(name, running)))
        log.info("daemon %s generation %d started", name, generation)

    def _track(self, coroutine: Awaitable[None]) -> None:
        if self._stopping.is_set():
            if asyncio.iscoroutine(coroutine):
                coroutine.close()  # shutdown gives back what is left itself
            return
        task = asyncio.ensure_future(coroutine)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _finished(self, name: str, running: _Running) -> None:
        if self._running.get(name) is not running:
            return
        await self._give_back(name, running)

    async def _give_back(self, name: str, running: _Running) -> None:
        if self._running.get(name) is running:
            del self._running[name]
        if not running.stopped_sent:
            running.stopped_sent = True
            await self._stopped(name, running.ctx.generation, self.interval_ms / 1000)

    async def _stopped(self, name: str, generation: int, limit: float) -> None:
        try:
            await self._api.stopped(name, generation, timeout_s=limit)
        except Conflict:
            pass  # moved on already
        except FencingError as error:
            log.warning("stopped of %s generation %d: %s", name, generation, error)

    def _cancel(self, running: _Running) -> None:
        running.ctx._cancelled = True
        running.ctx.draining.set()
        running.task.cancel()

    async def _watchdog(self) -> None:
        step = min(self.interval_ms / 8, 50) / 1000
        half = self.interval_ms * MS // 2
        while not self._stopping.is_set():
            now = _clock.now_ns()
            until = self._registered_until_ns
            for running in list(self._running.values()):
                if running.task.done():
                    continue
                drain = running.ctx._drain_deadline_ns
                if until is None or now >= until - half or (drain is not None and now >= drain):
                    log.warning("daemon %s generation %d cancelled at its deadline", running.ctx.name, running.ctx.generation)
                    self._cancel(running)
            await asyncio.sleep(step)
