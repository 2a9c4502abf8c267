"""Leader election through the gateway's lease API, with the Rust library's semantics.

- Every period has an owner of its own: ``<owner>#<incarnation>-<n>``, the incarnation random per
  process and ``n`` counting this process's periods. A period this process ended locally is over,
  so its next leadership is a new period with a new term (S2), even while the store still saw the
  old owner as the holder.
- Acquire with exponential backoff and full jitter while a follower; renew every ``ttl/3``
  (jittered up to 20% early) while leader; step down the moment a renewal fails, is refused or
  times out, or the local deadline passes.
- The deadline is the instant the last successful acquire or renewal was *sent*, plus the
  ``remaining_ms`` the store answered, minus the safety margin, on a clock that counts through
  suspend (see ``_clock``). :meth:`Leadership.check` reads that clock at the moment of acting, so
  a process that was paused past its lease finds itself not leader before any timer has run.
- Leader work runs as asyncio tasks cancelled the moment their period ends; shutdown drains them
  (bounded by the shutdown grace) and releases the lease only when they are gone.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import random
import secrets
import socket
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, List, Optional, Set, TypeVar, Union

from . import _clock
from .control import _MISSING, ControlClient
from .errors import Conflict, FencingError, NotLeader, OutcomeUnknown, ProtocolError, Unavailable

log = logging.getLogger("fencing_client")

T = TypeVar("T")
MS = _clock.NANOS_PER_MS


class LossReason(str, enum.Enum):
    """Why a period ended locally."""

    RENEW_REFUSED = "renew_refused"  # the store answered 409: another owner holds the lease
    RENEW_FAILED = "renew_failed"  # no answer in time, or one not understood
    DEADLINE = "deadline"  # the local deadline passed (a pause, a slow renewal)
    FENCED = "fenced"  # a fenced write was refused with 409: a newer term exists
    RESIGNED = "resigned"  # a handover was asked of this term
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class Elected:
    term: int
    owner: str


@dataclass(frozen=True)
class Lost:
    term: int
    owner: str
    reason: LossReason


Event = Union[Elected, Lost]


class Leadership:
    """One leadership period: its term, its owner and its deadline. Cancelled the moment it ends."""

    def __init__(self, elector: "Elector", term: int, owner: str, deadline_ns: int) -> None:
        self.term = term
        self.owner = owner
        self._elector = elector
        self._deadline_ns = deadline_ns
        self._ended = asyncio.Event()
        self.reason: Optional[LossReason] = None

    def is_valid(self) -> bool:
        """True while the period has not ended and its deadline, read now, has not passed."""
        return not self._ended.is_set() and _clock.now_ns() < self._deadline_ns

    def check(self) -> int:
        """The term, if this period still holds right now; else :class:`NotLeader`. Call it
        right before acting: it reads the clock, it does not wait for a timer."""
        if self._ended.is_set():
            raise NotLeader(f"the period of term {self.term} ended ({self.reason.value if self.reason else 'ended'})")
        if _clock.now_ns() >= self._deadline_ns:
            self._elector._end(self, LossReason.DEADLINE)
            raise NotLeader(f"the period of term {self.term} passed its local deadline")
        return self.term

    def remaining_s(self) -> float:
        """Seconds to the local deadline (0 once ended)."""
        if self._ended.is_set():
            return 0.0
        return max(0.0, (self._deadline_ns - _clock.now_ns()) / 1e9)

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    async def wait_ended(self) -> None:
        """Returns when the period has ended (a lost renewal, the deadline, shutdown)."""
        while not self._ended.is_set():
            timeout = max((self._deadline_ns - _clock.now_ns()) / 1e9, 0.0)
            try:
                await asyncio.wait_for(self._ended.wait(), timeout + 0.001)
            except asyncio.TimeoutError:
                self.check_silently()

    def check_silently(self) -> None:
        if not self._ended.is_set() and _clock.now_ns() >= self._deadline_ns:
            self._elector._end(self, LossReason.DEADLINE)

    async def run(self, work: Awaitable[T]) -> T:
        """Runs ``work`` within this period: cancelled, with :class:`OutcomeUnknown`, when the
        period ends first; :class:`NotLeader` (``work`` never started) when it already has.

        ``work`` runs as one of the period's tasks: the period's end cancels it, and the elector
        waits for it (as for leader work) before it releases the lease. However this call ends
        (its caller cancelled, a timeout around it), the work is cancelled and awaited first, so
        no send of an ended period goes on unseen."""
        try:
            self.check()
        except NotLeader:
            if asyncio.iscoroutine(work):
                work.close()
            elif asyncio.isfuture(work):
                work.cancel()
            raise
        task = self._elector._track(self, asyncio.ensure_future(work))
        ender = asyncio.ensure_future(self.wait_ended())
        try:
            done, _ = await asyncio.wait({task, ender}, return_when=asyncio.FIRST_COMPLETED)
            if task in done and not task.cancelled():
                return task.result()
            raise OutcomeUnknown(f"the period of term {self.term} ended while the work was in flight")
        finally:
            ender.cancel()
            if not task.done():
                if not self.ended:  # the period's end has cancelled it already: once is enough
                    task.cancel()
                await asyncio.wait({task}, timeout=self._elector.shutdown_grace_ms / 1000)


def default_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Elector:
    """Holds one lease key for this process through the gateway's control API.

    ``async with Elector(...) as elector:`` starts it and shuts it down; or call :meth:`start`
    and :meth:`shutdown`. Settings are in milliseconds and default as in the Rust library:
    renew ttl/3, retry the renew interval, margin ttl/10 (at least 50 ms), query timeout ttl/5,
    shutdown grace ttl/2. Settings that cannot be safe raise ``ValueError`` naming the setting.
    """

    def __init__(
        self,
        key: str,
        *,
        control_url: str = "http://127.0.0.1:9090",
        owner: Optional[str] = None,
        ttl_ms: int = 10_000,
        renew_ms: Optional[int] = None,
        retry_ms: Optional[int] = None,
        margin_ms: Optional[int] = None,
        query_timeout_ms: Optional[int] = None,
        shutdown_grace_ms: Optional[int] = None,
        value: Any = _MISSING,
        token: Optional[str] = None,
        control: Optional[ControlClient] = None,
    ) -> None:
        self.key = key
        self.ttl_ms = ttl_ms
        self.renew_ms = renew_ms if renew_ms is not None else ttl_ms // 3
        self.retry_ms = retry_ms if retry_ms is not None else self.renew_ms
        self.margin_ms = margin_ms if margin_ms is not None else max(50, ttl_ms // 10, ttl_ms // 1000)
        self.query_timeout_ms = query_timeout_ms if query_timeout_ms is not None else ttl_ms // 5
        self.shutdown_grace_ms = shutdown_grace_ms if shutdown_grace_ms is not None else ttl_ms // 2
        prefix = owner if owner is not None else default_owner()
        _validate(self, key, prefix)
        self._pid = os.getpid()
        self._incarnation = secrets.token_hex(6)
        self._prefix = prefix
        self._periods = 0
        self._value = value
        self._control = control if control is not None else ControlClient(control_url, token=token)
        self._own_control = control is None
        self._period: Optional[Leadership] = None
        self._last_term: Optional[int] = None
        self._last_owner: Optional[str] = None
        self._work: List[Callable[[Leadership], Awaitable[Any]]] = []
        self._tasks: Set["asyncio.Task[Any]"] = set()
        self._subscribers: List["asyncio.Queue[Event]"] = []
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._runner: Optional["asyncio.Task[None]"] = None
        self._drained = True

    # The public surface

    @property
    def incarnation(self) -> str:
        """Random per process: a child forked after this elector was built gets its own (and
        starts counting its periods from 0), so two processes never share an owner (S2)."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._incarnation = secrets.token_hex(6)
            self._periods = 0
        return self._incarnation

    @property
    def owner(self) -> str:
        """The owner of the current (or next) period."""
        return self._owner()

    def start(self) -> "Elector":
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run(), name=f"elector {self.key}")
        return self

    async def __aenter__(self) -> "Elector":
        return self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    def is_leader(self) -> bool:
        """True only while a period holds at this very moment (its deadline read now)."""
        period = self._period
        return period is not None and period.is_valid()

    def leadership(self) -> Leadership:
        """The current period; :class:`NotLeader` when there is none right now."""
        period = self._period
        if period is None:
            raise NotLeader(f"not leader of {self.key}")
        period.check()
        return period

    def current_term(self) -> Optional[int]:
        period = self._period
        return period.term if period is not None and period.is_valid() else None

    @property
    def last_term(self) -> Optional[int]:
        """The term of the last period, held or not (what a zombie would present)."""
        return self._last_term

    @property
    def last_owner(self) -> Optional[str]:
        """The owner of the last period, held or not."""
        return self._last_owner

    def events(self) -> AsyncIterator[Event]:
        """Every :class:`Elected` and :class:`Lost` from now on, in order."""
        queue: "asyncio.Queue[Event]" = asyncio.Queue()
        self._subscribers.append(queue)

        async def iterate() -> AsyncIterator[Event]:
            while True:
                yield await queue.get()

        return iterate()

    def spawn_leader_work(self, work: Callable[[Leadership], Awaitable[Any]]) -> None:
        """Runs ``work(leadership)`` at the start of every period (now, if leading), as a task
        cancelled the moment that period ends."""
        self._work.append(work)
        period = self._period
        if period is not None and period.is_valid():
            self._start_work(period, work)

    async def write_fenced(self, send: Callable[[int], Awaitable[T]]) -> T:
        """Calls ``send(term)`` within the current period: :class:`NotLeader` if there is none
        (nothing sent), :class:`OutcomeUnknown` if it ends while the send is in flight."""
        period = self.leadership()
        return await period.run(send(period.term))

    async def set_value(self, value: Any) -> None:
        """Sets this leader's value (its address, its version) for the current term, for
        followers to read with ``ControlClient.lease`` or ``watch_lease``: :class:`NotLeader`
        when no period holds, or the store says this owner no longer holds that term."""
        period = self.leadership()
        limit = min(self.query_timeout_ms / 1000, period.remaining_s())
        try:
            await self._control.set_value(self.key, period.owner, period.term, value, timeout_s=limit)
        except Conflict as error:
            raise NotLeader(f"the store refused the value of term {period.term}: {error}") from error
        self._value = value

    def step_down(self, reason: LossReason = LossReason.FENCED, term: Optional[int] = None) -> None:
        """Ends the current period (of ``term``, when given) locally: its work is cancelled, and
        the next leadership is a new period with a new term."""
        period = self._period
        if period is not None and (term is None or period.term == term):
            self._end(period, reason)

    async def shutdown(self) -> None:
        """Stops leader work (bounded by the shutdown grace), then releases the lease, unless the
        work overran the grace (then the lease runs out on its own)."""
        self._stopping.set()
        self._wake.set()
        if self._runner is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._runner), (self.shutdown_grace_ms + self.query_timeout_ms) / 1000 + 1)
            except asyncio.TimeoutError:
                self._runner.cancel()
            except Exception as error:  # noqa: BLE001: the loop's own failure, logged; shutdown goes on
                log.error("the elector of %s ended with %r", self.key, error)
        if self._own_control:
            await self._control.aclose()

    # The loop

    def _owner(self) -> str:
        return f"{self._prefix}#{self.incarnation}-{self._periods}"

    async def _run(self) -> None:
        try:
            await self._elect()
        finally:
            # However the loop ends (shutdown, or a failure nobody expected), no period outlives it.
            period = self._period
            if period is not None:
                self._end(period, LossReason.SHUTDOWN if self._stopping.is_set() else LossReason.RENEW_FAILED)
                if await self._drain():
                    await self._release(period.owner)

    async def _elect(self) -> None:
        backoff_ms = 25
        while not self._stopping.is_set():
            owner = self._owner()
            sent = _clock.now_ns()
            try:
                lease = await self._control.acquire(
                    self.key, owner, self.ttl_ms, value=self._value, timeout_s=self.query_timeout_ms / 1000
                )
            except Conflict as error:
                log.debug("acquire of %s refused: %s", self.key, error)
                retry_after = error.problem.get("lock_delay_remaining_ms")
                wait = self.retry_ms if not isinstance(retry_after, int) else min(max(retry_after, 10), self.retry_ms)
                await self._sleep(_jitter(wait))
                backoff_ms = 25
                continue
            except (Unavailable, ProtocolError, FencingError) as error:
                log.warning("acquire of %s failed: %s", self.key, error)
                await self._sleep(random.uniform(0, backoff_ms))
                backoff_ms = min(backoff_ms * 2, self.retry_ms)
                continue
            deadline = sent + lease.remaining_ms * MS - self.margin_ms * MS
            if deadline <= _clock.now_ns() or (self._last_term is not None and lease.term <= self._last_term):
                # Granted, but too late to act on, or with a term this process already had (an
                # answer replayed, a store gone back): a period it never starts. The next attempt
                # is a new period (a new owner), after a pause.
                log.warning("acquire of %s answered term %d too late or not above %s: not leading", self.key, lease.term, self._last_term)
                await self._release(owner)  # held for nobody otherwise, until it expires
                self._periods += 1
                await self._sleep(random.uniform(0, backoff_ms))
                backoff_ms = min(backoff_ms * 2, self.retry_ms)
                continue
            backoff_ms = 25
            if self._stopping.is_set():
                await self._release(owner)
                break
            period = Leadership(self, lease.term, owner, deadline)
            self._period = period
            self._last_term = lease.term
            self._last_owner = owner
            self._emit(Elected(lease.term, owner))
            for work in list(self._work):
                self._start_work(period, work)
            reason = LossReason.RESIGNED if lease.resign_requested else await self._hold(period)
            self._end(period, reason)
            drained = await self._drain()
            self._periods += 1
            if drained:
                await self._release(owner)
            if reason == LossReason.RESIGNED:
                await self._sleep(self.ttl_ms)
        self._period = None

    async def _hold(self, period: Leadership) -> LossReason:
        """Renews until the period ends; returns why it ended."""
        while True:
            wait_ms = self.renew_ms * random.uniform(0.8, 1.0)
            ender = asyncio.ensure_future(period.wait_ended())
            stopper = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait({ender, stopper}, timeout=wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ender.cancel()
                stopper.cancel()
            if period.ended:
                return period.reason or LossReason.DEADLINE
            if self._stopping.is_set():
                return LossReason.SHUTDOWN
            left_s = period.remaining_s()
            limit = min(self.query_timeout_ms / 1000, left_s)
            sent = _clock.now_ns()
            try:
                lease = await asyncio.wait_for(
                    self._control.renew(self.key, period.owner, self.ttl_ms, timeout_s=limit), limit
                )
            except Conflict as error:
                log.warning("renewal of %s term %d refused: %s", self.key, period.term, error)
                return LossReason.RENEW_REFUSED
            except (asyncio.TimeoutError, FencingError) as error:
                log.warning("renewal of %s term %d failed: %s", self.key, period.term, error)
                return LossReason.RENEW_FAILED
            if period.ended:
                return period.reason or LossReason.DEADLINE
            if _clock.now_ns() >= period._deadline_ns:
                # The answer came after the deadline: the period is over (a reader may already
                # have seen it so), and is never extended back into being.
                return LossReason.DEADLINE
            if lease.term != period.term:
                log.warning("renewal of %s answered term %d for term %d", self.key, lease.term, period.term)
                return LossReason.RENEW_FAILED
            period._deadline_ns = sent + lease.remaining_ms * MS - self.margin_ms * MS
            if lease.resign_requested:
                return LossReason.RESIGNED
            period.check_silently()

    def _end(self, period: Leadership, reason: LossReason) -> None:
        if period._ended.is_set():
            return
        period.reason = reason
        period._ended.set()
        if self._period is period:
            self._period = None
        for task in list(self._tasks):
            if getattr(task, "_fencing_period", None) is period:
                task.cancel()
        self._emit(Lost(period.term, period.owner, reason))
        self._wake.set()

    async def _drain(self) -> bool:
        tasks = list(self._tasks)
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=self.shutdown_grace_ms / 1000)
        if pending:
            log.error("leader work of %s did not stop within the shutdown grace: not releasing", self.key)
            return False
        return True

    async def _release(self, owner: str) -> None:
        try:
            await self._control.release(self.key, owner, timeout_s=self.query_timeout_ms / 1000)
        except FencingError as error:
            log.debug("release of %s as %s: %s", self.key, owner, error)

    def _track(self, period: Leadership, task: "asyncio.Task[T]") -> "asyncio.Task[T]":
        """Makes ``task`` one of ``period``'s: cancelled at its end, waited for before a release."""
        task._fencing_period = period  # type: ignore[attr-defined]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if period.ended:
            task.cancel()
        return task

    def _start_work(self, period: Leadership, work: Callable[[Leadership], Awaitable[Any]]) -> None:
        async def guarded() -> None:
            try:
                await work(period)
            except asyncio.CancelledError:
                raise
            except NotLeader:
                pass
            except Exception:  # noqa: BLE001: leader work's own failure must not stop the elector
                log.exception("leader work of %s term %d failed", self.key, period.term)

        self._track(period, asyncio.get_running_loop().create_task(guarded()))

    def _emit(self, event: Event) -> None:
        for queue in self._subscribers:
            queue.put_nowait(event)

    async def _sleep(self, ms: float) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._stopping.wait(), ms / 1000)
        except asyncio.TimeoutError:
            pass


def _jitter(ms: float) -> float:
    return ms * random.uniform(0.5, 1.0)


def _validate(elector: Elector, key: str, owner: str) -> None:
    ttl, margin = elector.ttl_ms, elector.margin_ms
    checks = [
        (100 <= ttl <= 3_600_000, "ttl_ms must be 100 ms to 1 h"),
        (0 < len(key) <= 200, "key must be 1 to 200 characters"),
        (0 < len(owner) <= 200 and "#" not in owner, "owner must be 1 to 200 characters without '#'"),
        (margin * 2 < ttl, "margin_ms must be less than half the ttl"),
        (margin >= max(50, ttl // 1000), "margin_ms must be at least 50 ms (or ttl/1000)"),
        (elector.renew_ms >= 10 and elector.retry_ms >= 10, "renew_ms and retry_ms must be at least 10 ms"),
        (elector.retry_ms <= ttl, "retry_ms must be at most the ttl"),
        (elector.query_timeout_ms > 0, "query_timeout_ms must be positive"),
        (
            (elector.renew_ms + elector.query_timeout_ms) * 3 <= (ttl - margin) * 2,
            "renew_ms + query_timeout_ms must be at most two thirds of ttl minus margin",
        ),
        (0 < elector.shutdown_grace_ms <= ttl, "shutdown_grace_ms must be positive and at most the ttl"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
