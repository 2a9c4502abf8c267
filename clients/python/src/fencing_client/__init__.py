"""fencing-client: leader election, leader-only work, fenced writes and membership through
fencing-gateway's HTTP API, with the semantics of its Rust library (docs/CONTRACT.md)."""

from ._clock import CLOCK_NAME
from .control import Assignment, ControlClient, Lease, Members, Node, Registration
from .daemons import DaemonContext, Daemons
from .elector import Elected, Elector, Leadership, LossReason, Lost
from .errors import (
    Conflict,
    FencingError,
    NotLeader,
    OutcomeUnknown,
    ProblemError,
    ProtocolError,
    StaleLeader,
    Unavailable,
)
from .fenced import FencedHttp
from .membership import IdentityConflict, Membership, NodeJoined, NodeLeft
from .sync import SyncElector

__all__ = [
    "Assignment",
    "DaemonContext",
    "Daemons",
    "CLOCK_NAME",
    "Conflict",
    "ControlClient",
    "Elected",
    "Elector",
    "FencedHttp",
    "FencingError",
    "IdentityConflict",
    "Lease",
    "Leadership",
    "LossReason",
    "Lost",
    "Members",
    "Membership",
    "Node",
    "NodeJoined",
    "NodeLeft",
    "NotLeader",
    "OutcomeUnknown",
    "ProblemError",
    "ProtocolError",
    "Registration",
    "StaleLeader",
    "SyncElector",
    "Unavailable",
]
__version__ = "0.1.0"
