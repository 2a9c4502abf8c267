"""The clock local deadlines are measured on.

A deadline must keep counting while the host or VM is suspended: a process that wakes up from a
suspend longer than its lease must find its deadline passed. On Linux that is ``CLOCK_BOOTTIME``
(what the Rust library uses). Elsewhere Python has no such clock everywhere (``time.monotonic``
stops during a suspend on Linux and on macOS), so the fallback counts the larger of how far the
monotonic clock and the wall clock moved since start: a suspend shows on the wall clock, a step of
the wall clock backwards is covered by the monotonic one, and a step forwards only ends a period
early, never late.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

NANOS_PER_MS = 1_000_000


def _boottime() -> Callable[[], int] | None:
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None:
        return None
    try:
        time.clock_gettime_ns(clock_id)
    except OSError:
        return None
    return lambda: time.clock_gettime_ns(clock_id)


class _MaxOfClocks:
    """Elapsed time as the larger of monotonic and wall time since start, never going back."""

    def __init__(self) -> None:
        self._mono0 = time.monotonic_ns()
        self._wall0 = time.time_ns()
        self._last = 0
        self._lock = threading.Lock()

    def __call__(self) -> int:
        elapsed = max(time.monotonic_ns() - self._mono0, time.time_ns() - self._wall0)
        with self._lock:
            self._last = max(self._last, elapsed)
            return self._last


_BOOT = _boottime()

#: The name of the clock in use, for logs and the README.
CLOCK_NAME = "CLOCK_BOOTTIME" if _BOOT is not None else "max(monotonic, wall) since start"

#: Nanoseconds on a clock that counts through suspend; only differences mean anything.
now_ns: Callable[[], int] = _BOOT if _BOOT is not None else _MaxOfClocks()
