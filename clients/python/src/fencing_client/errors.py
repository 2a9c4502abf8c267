"""The client's errors: one base class, and what each failure means for leadership."""

from __future__ import annotations

from typing import Any, Mapping, Optional


class FencingError(Exception):
    """Every error this package raises (settings errors are ``ValueError``)."""


class NotLeader(FencingError):
    """This process does not lead (or its period ended): nothing was sent."""


class OutcomeUnknown(FencingError):
    """The period ended while a write was in flight: it may or may not arrive. Treat it as
    indeterminate; the fence refuses it once a newer term is admitted."""


class Unavailable(FencingError):
    """The gateway could not be reached, or did not answer within the time allowed."""


class ProtocolError(FencingError):
    """The gateway answered something this client does not understand (a status it does not
    expect, a body that is not the JSON it should be). Never taken as leadership."""

    def __init__(self, message: str, status: Optional[int] = None, body: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class ProblemError(FencingError):
    """The gateway refused a call with an ``application/problem+json`` answer."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem = dict(problem)
        self.kind = problem_kind(self.problem)
        detail = self.problem.get("detail") or self.problem.get("title") or ""
        super().__init__(f"{status} {self.kind}: {detail}")


class Conflict(ProblemError):
    """A 409 from the control API: the lease is held by another owner, a lock-delay runs, the
    caller is not the holder, an assignment moved."""


class StaleLeader(ProblemError):
    """A fenced write was refused with 409 (``stale-term``, ``not-leader``, ``future-term``):
    the writer is not the current leader. Nothing was forwarded; the local period has ended."""

    @property
    def current_term(self) -> Optional[int]:
        value = self.problem.get("current_term")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def problem_kind(problem: Mapping[str, Any]) -> str:
    """The problem's short name: ``stale-term`` for ``urn:fencing-gateway:problem:stale-term``."""
    kind = problem.get("type")
    if isinstance(kind, str) and kind.startswith("urn:fencing-gateway:problem:"):
        return kind[len("urn:fencing-gateway:problem:") :]
    return str(kind) if kind is not None else "unknown"
