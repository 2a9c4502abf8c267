"""A thin synchronous wrapper: the asyncio elector on an event loop of its own thread.

``is_leader()`` and ``check()`` read the clock in the calling thread, so a blocking program asks
the same question at the moment it acts as an async one does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Optional

import httpx

from .elector import Elector, Leadership
from .errors import NotLeader, OutcomeUnknown
from .fenced import FencedHttp


class SyncElector:
    """``with SyncElector("billing", control_url=..., proxy_url=...) as leader:`` then
    ``leader.is_leader()``, ``leader.check()``, ``leader.post(path, ...)``."""

    def __init__(
        self,
        key: str,
        *,
        proxy_url: str = "http://127.0.0.1:8080",
        mode: str = "verify",
        http_transport: Optional[httpx.AsyncBaseTransport] = None,
        **settings: Any,
    ):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"fencing-elector-{key}", daemon=True)
        self._thread.start()
        self._key = key
        token = settings.get("token")

        async def build() -> "tuple[Elector, FencedHttp]":
            elector = Elector(key, **settings).start()
            return elector, FencedHttp(elector, proxy_url, mode=mode, token=token, transport=http_transport)

        self.elector, self.http = self._call(build(), timeout_s=10)

    def _call(self, coroutine: Any, timeout_s: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError as error:  # not TimeoutError before Python 3.11
            future.cancel()
            raise OutcomeUnknown(f"no answer within {timeout_s} s") from error

    def __enter__(self) -> "SyncElector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def is_leader(self) -> bool:
        return self.elector.is_leader()

    def check(self) -> int:
        """The current term, read now, or :class:`NotLeader`. Only reads, in this thread: a
        period found past its deadline is ended on the elector's own loop."""
        period = self.leadership()
        if period is None:
            raise NotLeader(f"not leader of {self._key}")
        return period.term

    def leadership(self) -> Optional[Leadership]:
        period = self.elector._period
        if period is None:
            return None
        if not period.is_valid():
            self._loop.call_soon_threadsafe(period.check_silently)
            return None
        return period

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A fenced write (see :meth:`FencedHttp.request`), waited for at most its period."""
        limit = self.elector.ttl_ms / 1000 + 5
        return self._call(self.http.request(method, path, **kwargs), timeout_s=limit)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def shutdown(self) -> None:
        if not self._loop.is_running():
            return

        async def stop() -> None:
            await self.elector.shutdown()
            await self.http.aclose()

        try:
            self._call(stop(), timeout_s=self.elector.ttl_ms / 1000 + 5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
