"""A node of a cluster that runs daemons d1..dN through the gateway, printing JSON lines.

    python3 examples/daemon_node.py --cluster workers --node-id p1 --daemons 4

Each running daemon, every tick, writes ``POST /jobs/tick`` through the gateway's proxy with its
generation as ``Fencing-Token`` and ``Fencing-Resource: ticks-<daemon>``, and stops at a 409 (a
newer instance wrote). Lines: ``started``, ``elected``/``lost``, ``daemon_started`` and
``daemon_stopped`` (with ``daemon`` and ``generation``), ``tick_refused``, ``stopped``. A line
``shutdown`` on stdin (or SIGTERM) drains the daemons, gives them back, releases and leaves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

import httpx

from fencing_client import DaemonContext, Daemons, Elected, Elector


def say(**line: Any) -> None:
    print(json.dumps(line), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", default="http://127.0.0.1:9090")
    parser.add_argument("--proxy", default="http://127.0.0.1:8080")
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--key")
    parser.add_argument("--daemons", type=int, default=5)
    parser.add_argument("--heartbeat-ms", type=int, default=15_000)
    parser.add_argument("--registration-ttl-ms", type=int)
    parser.add_argument("--ttl-ms", type=int, default=60_000)
    parser.add_argument("--ack-ms", type=int, default=30_000)
    parser.add_argument("--drain-ms", type=int, default=60_000)
    parser.add_argument("--tick-ms", type=int, default=100)
    # For the tests: daemons that never ask is_valid(), so only the runner's watchdog stops them.
    parser.add_argument("--no-validity-check", action="store_true")
    args = parser.parse_args()

    http = httpx.AsyncClient(base_url=args.proxy, trust_env=False, timeout=2.0)

    async def daemon(ctx: DaemonContext) -> None:
        say(event="daemon_started", daemon=ctx.name, generation=ctx.generation)
        n = 0
        try:
            while not ctx.is_draining() and (args.no_validity_check or ctx.is_valid()):
                n += 1
                headers = {
                    "fencing-token": str(ctx.fencing_token),
                    "fencing-resource": f"ticks-{ctx.name}",
                    "x-request-id": f"{args.node_id}-{ctx.name}-{ctx.generation}-{n}",
                }
                try:
                    answer = await http.post("/jobs/tick", headers=headers, content=b"")
                except httpx.HTTPError:
                    answer = None
                if answer is not None and answer.status_code == 409:
                    say(event="tick_refused", daemon=ctx.name, generation=ctx.generation)
                    return
                await asyncio.sleep(args.tick_ms / 1000)
        finally:
            say(event="daemon_stopped", daemon=ctx.name, generation=ctx.generation)

    elector = Elector(args.key or f"{args.cluster}-leader", control_url=args.control, owner=args.node_id, ttl_ms=args.ttl_ms)
    runner = Daemons(
        args.cluster,
        {f"d{i}": daemon for i in range(1, args.daemons + 1)},
        control_url=args.control,
        node_id=args.node_id,
        elector=elector,
        interval_ms=args.heartbeat_ms,
        ttl_ms=args.registration_ttl_ms,
        ack_timeout_ms=args.ack_ms,
        drain_timeout_ms=args.drain_ms,
    )
    events = elector.events()

    async def report() -> None:
        async for event in events:
            if isinstance(event, Elected):
                say(event="elected", term=event.term)
            else:
                say(event="lost", term=event.term, reason=event.reason.value)

    reporter = asyncio.ensure_future(report())
    say(event="started", node_id=args.node_id, incarnation=runner.incarnation)
    runner.start()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)

    async def read_stdin() -> None:
        while True:
            line = await stdin.readline()
            if not line or line.strip() == b"shutdown":
                stop.set()
                return

    reader = asyncio.ensure_future(read_stdin())
    await stop.wait()
    await runner.shutdown()
    reader.cancel()
    reporter.cancel()
    await http.aclose()
    say(event="stopped")


if __name__ == "__main__":
    asyncio.run(main())
