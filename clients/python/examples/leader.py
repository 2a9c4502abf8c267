"""A leader process: elects through the gateway, prints its state as JSON lines, and writes
through the gateway when told to on stdin (one JSON object per line).

    python3 examples/leader.py --key ledger-writer --owner a
    {"cmd": "write", "id": "a-1", "path": "/ledger/acct-1/entries"}           # a fenced write
    {"cmd": "write", "id": "a-2", "path": "/ledger/acct-1/entries", "force": true, "mode": "stamp"}
    {"cmd": "request_resign", "successor": "b"}                              # ask the holder to hand over
    {"cmd": "shutdown"}

``force`` sends with the last term even when not leading (to show the fence refuses a zombie).
The tests of tests/tests/clients drive it as a real process (SIGSTOP, SIGCONT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, Dict

from fencing_client import CLOCK_NAME, ControlClient, Elected, Elector, FencedHttp, FencingError, ProblemError


def say(**line: Any) -> None:
    print(json.dumps(line), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", default="http://127.0.0.1:9090")
    parser.add_argument("--proxy", default="http://127.0.0.1:8080")
    parser.add_argument("--key", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--ttl-ms", type=int, default=10_000)
    parser.add_argument("--renew-ms", type=int)
    parser.add_argument("--margin-ms", type=int)
    parser.add_argument("--query-timeout-ms", type=int)
    args = parser.parse_args()

    elector = Elector(
        args.key,
        control_url=args.control,
        owner=args.owner,
        ttl_ms=args.ttl_ms,
        renew_ms=args.renew_ms,
        margin_ms=args.margin_ms,
        query_timeout_ms=args.query_timeout_ms,
    )
    control = ControlClient(args.control)
    verify = FencedHttp(elector, args.proxy)
    stamp = FencedHttp(elector, args.proxy, mode="stamp")
    events = elector.events()
    say(event="started", owner=elector.owner, incarnation=elector.incarnation, clock=CLOCK_NAME)

    async def report() -> None:
        async for event in events:
            if isinstance(event, Elected):
                say(event="elected", term=event.term, owner=event.owner)
            else:
                say(event="lost", term=event.term, owner=event.owner, reason=event.reason.value)

    reporter = asyncio.ensure_future(report())
    elector.start()

    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while True:
        raw = await stdin.readline()
        if not raw:
            break
        command: Dict[str, Any] = json.loads(raw)
        if command.get("cmd") == "shutdown":
            break
        if command.get("cmd") == "request_resign":
            # Any process may ask the holder to hand over (an operator, a deploy, the successor).
            try:
                answer = await control.request_resign(args.key, "handover test", successor=command.get("successor"))
                say(event="resign_request", outcome=answer.get("outcome"), term=answer.get("term"))
            except FencingError as error:
                say(event="resign_request", error=type(error).__name__, detail=str(error))
            continue
        if command.get("cmd") == "write":
            # Asked at the moment of acting, before anything is sent.
            leading = elector.is_leader()
            http = stamp if command.get("mode") == "stamp" else verify
            line: Dict[str, Any] = dict(event="write", id=command["id"], is_leader_before=leading)
            try:
                answer = await http.post(
                    command["path"], headers={"x-request-id": command["id"]}, content=b"", force=bool(command.get("force"))
                )
                line.update(status=answer.status_code, term=answer.headers.get("fencing-token"))
            except ProblemError as error:
                line.update(status=error.status, error=type(error).__name__, kind=error.kind, problem=error.problem)
            except FencingError as error:
                line.update(status=None, error=type(error).__name__, detail=str(error))
            say(**line)
    await elector.shutdown()
    await verify.aclose()
    await stamp.aclose()
    await control.aclose()
    reporter.cancel()
    say(event="stopped")


if __name__ == "__main__":
    asyncio.run(main())
