"""The gateway's control API (leases, membership): every call bounded, every answer checked.

An answer this client does not understand raises :class:`ProtocolError` and is never read as a
grant: a 200 whose body is not the lease asked for (another key or owner, a term that is not a
positive integer, a missing ``remaining_ms``) is as good as no answer.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional
from urllib.parse import quote

import httpx

from .errors import Conflict, ProblemError, ProtocolError, Unavailable

_MISSING: Any = object()


@dataclass(frozen=True)
class Lease:
    """A lease as the gateway granted or renewed it (``remaining_ms`` from the store's clock)."""

    key: str
    owner: str
    term: int
    remaining_ms: int
    ttl_ms: int
    resign_requested: bool = False
    value: Any = None


@dataclass(frozen=True)
class Registration:
    """A node's accepted heartbeat."""

    cluster: str
    node_id: str
    remaining_ms: int
    ttl_ms: int


@dataclass(frozen=True)
class Node:
    """A live member of a cluster, as the last read saw it."""

    node_id: str
    name: Optional[str]
    started_at: str
    remaining_ms: int
    metadata: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Members:
    """A cluster's live nodes and the revision of that list (for the next watch)."""

    cluster: str
    revision: int
    nodes: List[Node]


def _int(body: Mapping[str, Any], name: str, minimum: int = 0) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ProtocolError(f"field {name!r} is not an integer >= {minimum}: {value!r}")
    return value


def _str(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise ProtocolError(f"field {name!r} is not a string: {value!r}")
    return value


def http_client(
    base_url: str,
    token: Optional[str],
    timeout_s: float,
    transport: Optional[httpx.AsyncBaseTransport],
    verify: Any,
    headers: Optional[Dict[str, str]] = None,
) -> httpx.AsyncClient:
    """An HTTP client to one of the gateway's listeners: the bearer token only in
    ``Authorization``, no proxy from the environment, no redirect followed."""
    sent = dict(headers or {})
    if token is not None:
        sent["authorization"] = f"Bearer {token}"
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/"),
        headers=sent,
        timeout=timeout_s,
        follow_redirects=False,
        trust_env=False,
        transport=transport,
        verify=verify,
    )


def _segment(value: str) -> str:
    return quote(value, safe="")


class ControlClient:
    """An async client of the control listener (``http://127.0.0.1:9090`` by default).

    ``token`` is the bearer token of a ``[[clients]]`` entry; it is sent only in the
    ``Authorization`` header and never logged. Proxies from the environment are ignored, and
    redirects are not followed.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:9090",
        *,
        token: Optional[str] = None,
        timeout_s: float = 5.0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        verify: Any = True,
    ) -> None:
        self.timeout_s = timeout_s
        self._http = http_client(base_url, token, timeout_s, transport, verify, {"accept": "application/json"})

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        body: Optional[Mapping[str, Any]],
        timeout_s: Optional[float],
        expect: int = 200,
        params: Optional[Mapping[str, str]] = None,
    ) -> Any:
        limit = self.timeout_s if timeout_s is None else timeout_s
        if limit <= 0:
            raise Unavailable(f"{method} {path}: no time left")
        content = None if body is None else json.dumps(body).encode()
        headers = {} if body is None else {"content-type": "application/json"}
        try:
            response = await asyncio.wait_for(
                self._http.request(method, path, content=content, headers=headers, params=params, timeout=limit),
                limit,
            )
        except asyncio.TimeoutError as error:
            raise Unavailable(f"{method} {path}: no answer within {limit:.3f} s") from error
        except httpx.HTTPError as error:
            raise Unavailable(f"{method} {path}: {type(error).__name__}: {error}") from error
        except (TypeError, ValueError) as error:  # a body json cannot encode, a bad URL
            raise ProtocolError(f"{method} {path}: {type(error).__name__}: {error}") from error
        try:
            return _read(method, path, response, expect)
        except (ProblemError, ProtocolError):
            raise
        except Exception as error:  # noqa: BLE001: JSON nested too deep, anything else: not understood
            raise ProtocolError(f"{method} {path}: {type(error).__name__} reading the answer", response.status_code) from error

    # Leases

    async def acquire(
        self, key: str, owner: str, ttl_ms: int, *, value: Any = _MISSING, timeout_s: Optional[float] = None
    ) -> Lease:
        return await self._lease("acquire", key, owner, ttl_ms, value, timeout_s)

    async def renew(
        self, key: str, owner: str, ttl_ms: int, *, value: Any = _MISSING, timeout_s: Optional[float] = None
    ) -> Lease:
        return await self._lease("renew", key, owner, ttl_ms, value, timeout_s)

    async def _lease(
        self, verb: str, key: str, owner: str, ttl_ms: int, value: Any, timeout_s: Optional[float]
    ) -> Lease:
        body: Dict[str, Any] = {"owner": owner, "ttl_ms": ttl_ms}
        if value is not _MISSING:
            body["value"] = value
        answer = await self._call("POST", f"/v1/leases/{_segment(key)}/{verb}", body, timeout_s)
        if not isinstance(answer, dict):
            raise ProtocolError(f"{verb}: the answer is not a JSON object")
        lease = Lease(
            key=_str(answer, "key"),
            owner=_str(answer, "owner"),
            term=_int(answer, "term", 1),
            remaining_ms=_int(answer, "remaining_ms"),
            ttl_ms=_int(answer, "ttl_ms"),
            resign_requested=answer.get("resign_requested") is True,
            value=answer.get("value"),
        )
        if lease.ttl_ms != ttl_ms or lease.remaining_ms > ttl_ms:
            raise ProtocolError(f"{verb}: asked for a ttl of {ttl_ms} ms, answered {lease.ttl_ms} ms with {lease.remaining_ms} ms left")
        # With [[clients]], the gateway keeps owners as "<client>/<owner>": accept that spelling.
        if lease.key != key or not (lease.owner == owner or lease.owner.endswith("/" + owner)):
            raise ProtocolError(f"{verb}: asked for {key!r} as {owner!r}, answered {lease.key!r} as {lease.owner!r}")
        return lease

    async def release(self, key: str, owner: str, *, timeout_s: Optional[float] = None) -> None:
        await self._call("POST", f"/v1/leases/{_segment(key)}/release", {"owner": owner}, timeout_s, expect=204)

    async def lease(
        self, key: str, *, after: Optional[int] = None, wait_ms: int = 0, timeout_s: Optional[float] = None
    ) -> Dict[str, Any]:
        """The lease as ``GET`` shows it (``owner``, ``term``, ``remaining_ms``, ``value``,
        ``revision``); a key nobody acquired yet is ``{"key": key, "revision": 0}``. With
        ``after``, waits up to ``wait_ms`` for a change since that revision (the watch)."""
        params = None
        if after is not None:
            params = {"after": str(after), "wait": f"{max(wait_ms, 0)}ms"}
        limit = timeout_s if timeout_s is not None else self.timeout_s + wait_ms / 1000
        try:
            answer = await self._call("GET", f"/v1/leases/{_segment(key)}", None, limit, params=params)
        except ProblemError as error:
            if error.status == 404:
                return {"key": key, "revision": 0}
            raise
        if not isinstance(answer, dict):
            raise ProtocolError("lease: the answer is not a JSON object")
        _int(answer, "revision")
        return answer

    async def watch_lease(self, key: str, *, wait_ms: int = 30_000) -> AsyncIterator[Dict[str, Any]]:
        """The lease now, then every change of it (a new term, holder, value, release, expiry),
        each once: a watch that ends unanswered is asked again from the same revision."""
        state = await self.lease(key)
        yield state
        while True:
            revision = state["revision"]
            state = await self.lease(key, after=revision, wait_ms=wait_ms)
            if state["revision"] != revision:
                yield state

    async def request_resign(
        self,
        key: str,
        reason: str,
        *,
        successor: Optional[str] = None,
        force_after_ms: Optional[int] = None,
        timeout_s: Optional[float] = None,
    ) -> Dict[str, Any]:
        """Asks the holder of ``key`` to hand over (to ``successor``, an owner as given to its
        elector): ``{"key", "term", "successor", "outcome"}``, ``outcome`` ``requested``, or with
        ``force_after_ms`` ``stepped_down`` or ``forced``. :class:`Conflict` (``not-held``) when
        nobody holds it."""
        body: Dict[str, Any] = {"reason": reason}
        if successor is not None:
            body["successor"] = successor
        if force_after_ms is not None:
            body["force_after_ms"] = force_after_ms
        limit = timeout_s if timeout_s is not None else self.timeout_s + (force_after_ms or 0) / 1000
        answer = await self._call("POST", f"/v1/leases/{_segment(key)}/resign-request", body, limit, expect=202 if force_after_ms is None else 200)
        if not isinstance(answer, dict):
            raise ProtocolError("resign-request: the answer is not a JSON object")
        _str(answer, "outcome")
        return answer

    async def set_value(self, key: str, owner: str, term: int, value: Any, *, timeout_s: Optional[float] = None) -> None:
        """Sets the holder's value for ``term``: :class:`Conflict` (``not-holder``) unless that
        owner holds the lease at that term."""
        body = {"owner": owner, "term": term, "value": value}
        await self._call("PUT", f"/v1/leases/{_segment(key)}/value", body, timeout_s)

    # Membership

    async def heartbeat(
        self,
        cluster: str,
        node_id: str,
        incarnation: str,
        ttl_ms: int,
        *,
        name: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        timeout_s: Optional[float] = None,
    ) -> Registration:
        body: Dict[str, Any] = {"incarnation": incarnation, "ttl_ms": ttl_ms, "metadata": dict(metadata or {})}
        if name is not None:
            body["name"] = name
        path = f"/v1/clusters/{_segment(cluster)}/nodes/{_segment(node_id)}/heartbeat"
        answer = await self._call("POST", path, body, timeout_s)
        if not isinstance(answer, dict):
            raise ProtocolError("heartbeat: the answer is not a JSON object")
        registration = Registration(
            cluster=_str(answer, "cluster"),
            node_id=_str(answer, "node_id"),
            remaining_ms=_int(answer, "remaining_ms"),
            ttl_ms=_int(answer, "ttl_ms"),
        )
        if registration.remaining_ms > ttl_ms:
            raise ProtocolError(f"heartbeat: asked for a ttl of {ttl_ms} ms, answered {registration.remaining_ms} ms left")
        if registration.cluster != cluster or registration.node_id != node_id:
            raise ProtocolError(f"heartbeat: asked for {cluster}/{node_id}, answered {registration}")
        return registration

    async def leave(self, cluster: str, node_id: str, incarnation: str, *, timeout_s: Optional[float] = None) -> None:
        path = f"/v1/clusters/{_segment(cluster)}/nodes/{_segment(node_id)}/leave"
        await self._call("POST", path, {"incarnation": incarnation}, timeout_s, expect=204)

    async def members(
        self, cluster: str, *, after: Optional[int] = None, wait_ms: int = 0, timeout_s: Optional[float] = None
    ) -> Members:
        """The live nodes; with ``after``, waits up to ``wait_ms`` for a change since that revision."""
        params = None
        if after is not None:
            params = {"after": str(after), "wait": f"{max(wait_ms, 0)}ms"}
        limit = timeout_s if timeout_s is not None else self.timeout_s + wait_ms / 1000
        answer = await self._call("GET", f"/v1/clusters/{_segment(cluster)}/nodes", None, limit, params=params)
        if not isinstance(answer, dict) or not isinstance(answer.get("nodes"), list):
            raise ProtocolError("members: the answer has no list of nodes")
        nodes = []
        for entry in answer["nodes"]:
            if not isinstance(entry, dict):
                raise ProtocolError("members: a node is not a JSON object")
            metadata = entry.get("metadata")
            nodes.append(
                Node(
                    node_id=_str(entry, "node_id"),
                    name=entry.get("name") if isinstance(entry.get("name"), str) else None,
                    started_at=_str(entry, "started_at"),
                    remaining_ms=_int(entry, "remaining_ms"),
                    metadata=metadata if isinstance(metadata, dict) else {},
                )
            )
        return Members(cluster=cluster, revision=_int(answer, "revision"), nodes=nodes)


@dataclass(frozen=True)
class Assignment:
    """One of a node's assignments: ``state`` is ``assigning``, ``active`` or ``revoking``;
    ``remaining_ms`` runs to the acknowledge or drain deadline (``None`` while active)."""

    daemon: str
    generation: int
    state: str
    remaining_ms: Optional[int]


class DaemonsApi:
    """The daemon calls of the control API, on a :class:`ControlClient`."""

    def __init__(self, control: ControlClient, cluster: str, node_id: str, incarnation: str) -> None:
        self.control = control
        self.base = f"/v1/clusters/{_segment(cluster)}/nodes/{_segment(node_id)}/assignments"
        self.cluster = cluster
        self.incarnation = incarnation

    async def assignments(self, daemons: List[str], *, timeout_s: Optional[float] = None) -> List[Assignment]:
        answer = await self.control._call(
            "POST", self.base, {"incarnation": self.incarnation, "daemons": daemons}, timeout_s
        )
        if not isinstance(answer, dict) or not isinstance(answer.get("assignments"), list):
            raise ProtocolError("assignments: the answer has no list of assignments")
        out = []
        for entry in answer["assignments"]:
            if not isinstance(entry, dict):
                raise ProtocolError("assignments: an assignment is not a JSON object")
            state = _str(entry, "state")
            if state not in ("assigning", "active", "revoking"):
                raise ProtocolError(f"assignments: unknown state {state!r}")
            remaining = entry.get("remaining_ms")
            if remaining is not None:
                remaining = _int(entry, "remaining_ms")
            elif state != "active":
                raise ProtocolError(f"assignments: {state} without remaining_ms")
            out.append(Assignment(_str(entry, "daemon"), _int(entry, "generation", 1), state, remaining))
        return out

    async def ack(self, daemon: str, generation: int, *, timeout_s: Optional[float] = None) -> int:
        """Acknowledges an assignment: the fencing token to start it with."""
        body = {"incarnation": self.incarnation, "generation": generation}
        answer = await self.control._call("POST", f"{self.base}/{_segment(daemon)}/ack", body, timeout_s)
        if not isinstance(answer, dict) or answer.get("state") != "active":
            raise ProtocolError("ack: the answer is not an active assignment")
        if _str(answer, "daemon") != daemon or _int(answer, "generation", 1) != generation:
            raise ProtocolError(f"ack: asked for {daemon} {generation}, answered {answer}")
        token = _int(answer, "fencing_token", 1)
        if token != generation:
            raise ProtocolError(f"ack: {daemon} generation {generation} answered the token {token}")
        return token

    async def stopped(self, daemon: str, generation: int, *, timeout_s: Optional[float] = None) -> None:
        body = {"incarnation": self.incarnation, "generation": generation}
        await self.control._call("POST", f"{self.base}/{_segment(daemon)}/stopped", body, timeout_s, expect=204)

    async def reconcile(
        self, lease: str, owner: str, term: int, ack_timeout_ms: int, drain_timeout_ms: int, *, timeout_s: Optional[float] = None
    ) -> List[Dict[str, Any]]:
        body = {
            "lease": lease,
            "owner": owner,
            "term": term,
            "ack_timeout_ms": ack_timeout_ms,
            "drain_timeout_ms": drain_timeout_ms,
        }
        answer = await self.control._call("POST", f"/v1/clusters/{_segment(self.cluster)}/reconcile", body, timeout_s)
        if not isinstance(answer, dict) or not isinstance(answer.get("changes"), list):
            raise ProtocolError("reconcile: the answer has no list of changes")
        return answer["changes"]


def _read(method: str, path: str, response: httpx.Response, expect: int) -> Any:
    status = response.status_code
    body = response.content
    content_type = response.headers.get("content-type", "")
    if status == expect:
        if expect == 204:
            return None
        try:
            return json.loads(body)
        except ValueError as error:
            raise ProtocolError(f"{method} {path}: {status} with a body that is not JSON", status, body) from error
    if content_type.startswith("application/problem+json"):
        try:
            problem = json.loads(body)
        except ValueError:
            problem = None
        if isinstance(problem, dict):
            if status == 409:
                raise Conflict(status, problem)
            raise ProblemError(status, problem)
    raise ProtocolError(f"{method} {path}: unexpected status {status}", status, body[:512])
