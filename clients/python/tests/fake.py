"""An in-memory stand-in for the gateway's control and proxy listeners (httpx.MockTransport),
for the unit tests: it can refuse, stall, or answer garbage on purpose."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Dict, List, Optional

import httpx


def problem(status: int, kind: str, **extra: Any) -> httpx.Response:
    body = {"type": f"urn:fencing-gateway:problem:{kind}", "title": kind, "status": status, "detail": kind}
    body.update(extra)
    return httpx.Response(status, headers={"content-type": "application/problem+json"}, content=json.dumps(body))


class FakeGateway:
    def __init__(self, remaining_ms: Optional[int] = None) -> None:
        self.holder: Optional[str] = None
        self.term = 0
        self.remaining_ms = remaining_ms
        self.calls: List[Dict[str, Any]] = []
        self.writes: List[httpx.Request] = []
        # Hooks: return a Response (or a coroutine of one) to override the normal answer.
        self.on_acquire: Optional[Callable[[Dict[str, Any]], Any]] = None
        self.on_renew: Optional[Callable[[Dict[str, Any]], Any]] = None
        self.on_write: Optional[Callable[[httpx.Request], Any]] = None
        self.value: Any = None
        self.nodes: Dict[str, Dict[str, Any]] = {}
        self.assignments: List[Dict[str, Any]] = []
        self.on_ack: Optional[Callable[[str, Dict[str, Any]], httpx.Response]] = None
        self.revision = 1

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def verbs(self, verb: str) -> List[Dict[str, Any]]:
        return [c for c in self.calls if c["verb"] == verb]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content and path.startswith("/v1/") else {}
        if path.startswith("/v1/leases/") and path.count("/") == 3:
            key = path.split("/")[3]
            if self.term == 0:
                return problem(404, "no-such-lease", revision=0)
            after = request.url.params.get("after")
            if after == str(self.revision):
                await asyncio.sleep(0.05)
            return httpx.Response(
                200,
                json={"key": key, "owner": self.holder, "term": self.term, "value": self.value, "revision": self.revision},
            )
        if path.startswith("/v1/leases/"):
            _, _, _, key, verb = path.split("/")
            self.calls.append({"verb": verb, **body})
            hook = {"acquire": self.on_acquire, "renew": self.on_renew}.get(verb)
            if hook is not None:
                answer = hook(body)
                if asyncio.iscoroutine(answer):
                    answer = await answer
                if answer is not None:
                    return answer
            return self.lease(key, verb, body)
        if path.startswith("/v1/clusters/"):
            if request.method == "GET" and request.url.params.get("after") == str(self.revision):
                await asyncio.sleep(0.05)  # a watch with nothing new: wait a little, as the gateway would
            return self.cluster(request, path, body)
        self.writes.append(request)
        if self.on_write is not None:
            answer = self.on_write(request)
            if asyncio.iscoroutine(answer):
                answer = await answer
            if answer is not None:
                return answer
        return httpx.Response(200, json={"ok": True})

    def lease(self, key: str, verb: str, body: Dict[str, Any]) -> httpx.Response:
        owner = body.get("owner")
        if verb == "value":
            if self.holder != owner or body.get("term") != self.term:
                return problem(409, "not-holder")
            self.value = body["value"]
            self.revision += 1
            return httpx.Response(200, json={"key": key, "term": self.term, "value": self.value})
        ttl = body.get("ttl_ms", 0)
        remaining = self.remaining_ms if self.remaining_ms is not None else ttl
        if verb == "acquire":
            if self.holder not in (None, owner):
                return problem(409, "lease-held", holder=self.holder, term=self.term)
            if self.holder is None:
                self.term += 1
                self.holder = owner
                self.value = None
                self.revision += 1
        elif verb == "renew":
            if self.holder != owner:
                return problem(409, "not-holder", holder=self.holder, term=self.term)
        elif verb == "release":
            if self.holder != owner:
                return problem(409, "not-holder")
            self.holder = None
            self.revision += 1
            return httpx.Response(204)
        return httpx.Response(
            200,
            json={
                "key": key,
                "owner": owner,
                "term": self.term,
                "remaining_ms": remaining,
                "ttl_ms": ttl,
                "expires_at": "2026-11-28T00:00:00Z",
                "resign_requested": False,
            },
        )

    def cluster(self, request: httpx.Request, path: str, body: Dict[str, Any]) -> httpx.Response:
        parts = path.split("/")
        cluster = parts[3]
        if request.method == "GET":
            self.calls.append({"verb": "members"})
            nodes = [
                {"node_id": n, "name": None, "started_at": v["started_at"], "remaining_ms": 1000, "metadata": {}}
                for n, v in self.nodes.items()
            ]
            return httpx.Response(200, json={"cluster": cluster, "nodes": nodes, "revision": self.revision})
        if len(parts) == 5 and parts[4] == "reconcile":
            self.calls.append({"verb": "reconcile", **body})
            return httpx.Response(200, json={"cluster": cluster, "term": body.get("term"), "changes": []})
        node, verb = parts[5], parts[6]
        self.calls.append({"verb": verb, "node": node, **body})
        if verb == "heartbeat":
            known = self.nodes.get(node)
            if known is not None and known["incarnation"] != body["incarnation"]:
                return problem(409, "node-id-in-use")
            if known is None:
                self.nodes[node] = {"incarnation": body["incarnation"], "started_at": f"t{self.revision}"}
                self.revision += 1
            return httpx.Response(
                200,
                json={
                    "cluster": cluster,
                    "node_id": node,
                    "started_at": self.nodes[node]["started_at"],
                    "expires_at": "x",
                    "remaining_ms": body["ttl_ms"],
                    "ttl_ms": body["ttl_ms"],
                },
            )
        if verb == "assignments" and len(parts) == 7:
            self.calls.append({"verb": "read-assignments", "node": node})
            return httpx.Response(200, json={"cluster": cluster, "node_id": node, "assignments": list(self.assignments)})
        if len(parts) == 9 and parts[6] == "assignments":
            daemon, step = parts[7], parts[8]
            self.calls.append({"verb": step, "daemon": daemon, **body})
            if step == "ack":
                if self.on_ack is not None:
                    return self.on_ack(daemon, body)
                for a in self.assignments:  # as the store: acknowledged is active
                    if a["daemon"] == daemon and a["generation"] == body["generation"]:
                        a.update(state="active", remaining_ms=None)
                return httpx.Response(
                    200,
                    json={"daemon": daemon, "generation": body["generation"], "state": "active",
                          "fencing_token": body["generation"], "waited_ms": 0},
                )
            self.assignments = [  # as the store: given back is gone
                a for a in self.assignments if not (a["daemon"] == daemon and a["generation"] == body["generation"])
            ]
            return httpx.Response(204)
        if verb == "leave":
            self.nodes.pop(node, None)
            self.revision += 1
            return httpx.Response(204)
        return httpx.Response(404)
