"""Fenced writes through the gateway's proxy listener.

A write is sent only while the elector's period holds, carries that period's term (verify mode:
``Fencing-Token``) or its lease and owner (stamp mode: the gateway stamps the term), and is
abandoned with :class:`OutcomeUnknown` if the period ends while it is in flight. A 409 from the
fence (``stale-term``, ``not-leader``, ``future-term``) raises :class:`StaleLeader` with the
problem's details and ends the local period: a newer leader exists.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Mapping, Optional

import httpx

from .control import http_client
from .elector import Elector, LossReason
from .errors import NotLeader, OutcomeUnknown, StaleLeader, Unavailable, problem_kind

#: The problems that mean "not the current leader".
FENCE_REFUSALS = frozenset({"stale-term", "not-leader", "future-term"})


class FencedHttp:
    """Sends an elector's writes through the gateway (``http://127.0.0.1:8080`` by default).

    ``mode`` is ``"verify"`` (the default: the client presents its term) or ``"stamp"`` (the
    client presents the lease and its owner; the gateway uses the lease's term if that owner
    holds it). Each write is bounded by its period: it never outlives it.
    """

    def __init__(
        self,
        elector: Elector,
        proxy_url: str = "http://127.0.0.1:8080",
        *,
        mode: str = "verify",
        token: Optional[str] = None,
        timeout_s: float = 5.0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        verify: Any = True,
    ) -> None:
        if mode not in ("verify", "stamp"):
            raise ValueError("mode must be 'verify' or 'stamp'")
        self.timeout_s = timeout_s
        self.elector = elector
        self.mode = mode
        self._http = http_client(proxy_url, token, timeout_s, transport, verify)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "FencedHttp":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        resource: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
        content: Optional[bytes] = None,
        json_body: Any = None,
        force: bool = False,
    ) -> httpx.Response:
        """Sends one fenced write and returns the upstream's answer (any status but a fence's 409).

        ``resource`` goes in ``Fencing-Resource`` for routes that name it by header. ``force``
        sends with the last term (or owner) even when this process no longer leads: only for
        demonstrating that the fence refuses a zombie; it never bypasses the fence itself.
        """
        if force:
            term, owner, period = self.elector.last_term, self.elector.last_owner or self.elector.owner, None
            if term is None:
                raise NotLeader("this process never led: no term to present")
        else:
            period = self.elector.leadership()
            term, owner = period.term, period.owner
        sent_headers = dict(headers or {})
        if self.mode == "verify":
            sent_headers["Fencing-Token"] = str(term)
        else:
            sent_headers["Fencing-Lease"] = self.elector.key
            sent_headers["Fencing-Owner"] = owner
        if resource is not None:
            sent_headers["Fencing-Resource"] = resource
        if json_body is not None:
            content = json.dumps(json_body).encode()
            sent_headers.setdefault("content-type", "application/json")
        send = self._http.request(method, path, headers=sent_headers, content=content)
        try:
            if period is not None:
                response = await period.run(send)
            else:
                response = await asyncio.wait_for(send, self.timeout_s)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as error:
            raise Unavailable(f"{method} {path}: not sent: {type(error).__name__}: {error}") from error
        except httpx.HTTPError as error:
            # Sent, or maybe sent: the gateway may have forwarded it.
            raise OutcomeUnknown(f"{method} {path}: {type(error).__name__}: {error}") from error
        except asyncio.TimeoutError as error:
            raise OutcomeUnknown(f"{method} {path}: no answer within {self.timeout_s} s") from error
        if response.status_code == 409 and response.headers.get("content-type", "").startswith(
            "application/problem+json"
        ):
            try:
                problem = json.loads(response.content)
            except ValueError:
                problem = None
            if isinstance(problem, dict) and problem_kind(problem) in FENCE_REFUSALS:
                self.elector.step_down(LossReason.FENCED, term=term)
                raise StaleLeader(409, problem)
        return response

    async def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.request("POST", path, **kwargs)

    async def put(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.request("PUT", path, **kwargs)

    async def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.request("DELETE", path, **kwargs)
