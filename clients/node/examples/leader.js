// A leader process: elects through the gateway, prints its state as JSON lines, and writes
// through the gateway when told to on stdin (one JSON object per line):
//
//   node examples/leader.js --key ledger-writer --owner a
//   {"cmd": "write", "id": "a-1", "path": "/ledger/acct-1/entries"}
//   {"cmd": "write", "id": "a-2", "path": "/ledger/acct-1/entries", "force": true, "mode": "stamp"}
//   {"cmd": "request_resign", "successor": "b"}     (ask the holder to hand over)
//   {"cmd": "shutdown"}
//
// `force` sends with the last term even when not leading (to show the fence refuses a zombie).

import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

import { CLOCK_NAME, ControlClient, Elector, FencedHttp, FencingError, ProblemError } from "../src/index.js";

const { values: args } = parseArgs({
  options: {
    control: { type: "string", default: "http://127.0.0.1:9090" },
    proxy: { type: "string", default: "http://127.0.0.1:8080" },
    key: { type: "string" },
    owner: { type: "string" },
    "ttl-ms": { type: "string", default: "10000" },
    "renew-ms": { type: "string" },
    "margin-ms": { type: "string" },
    "query-timeout-ms": { type: "string" },
  },
});
const number = (value) => (value === undefined ? undefined : Number(value));
const say = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);

const elector = new Elector(args.key, {
  controlUrl: args.control,
  owner: args.owner,
  ttlMs: number(args["ttl-ms"]),
  renewMs: number(args["renew-ms"]),
  marginMs: number(args["margin-ms"]),
  queryTimeoutMs: number(args["query-timeout-ms"]),
});
const control = new ControlClient({ baseUrl: args.control });
const verify = new FencedHttp(elector, { proxyUrl: args.proxy });
const stamp = new FencedHttp(elector, { proxyUrl: args.proxy, mode: "stamp" });
elector.on("event", (event) => say({ event: event.type, term: event.term, owner: event.owner, reason: event.reason }));
say({ event: "started", owner: elector.owner, incarnation: elector.incarnation, clock: CLOCK_NAME });
elector.start();

for await (const raw of createInterface({ input: process.stdin })) {
  const command = JSON.parse(raw);
  if (command.cmd === "shutdown") break;
  if (command.cmd === "request_resign") {
    // Any process may ask the holder to hand over (an operator, a deploy, the successor).
    try {
      const answer = await control.requestResign(args.key, "handover test", { successor: command.successor });
      say({ event: "resign_request", outcome: answer.outcome, term: answer.term });
    } catch (error) {
      if (!(error instanceof FencingError)) throw error;
      say({ event: "resign_request", error: error.name, detail: error.message });
    }
    continue;
  }
  if (command.cmd !== "write") continue;
  // Asked at the moment of acting, before anything is sent.
  const line = { event: "write", id: command.id, is_leader_before: elector.isLeader() };
  const http = command.mode === "stamp" ? stamp : verify;
  try {
    const answer = await http.post(command.path, { headers: { "x-request-id": command.id }, body: "", force: Boolean(command.force) });
    Object.assign(line, { status: answer.status, term: answer.headers.get("fencing-token") });
  } catch (error) {
    if (error instanceof ProblemError) {
      Object.assign(line, { status: error.status, error: error.name, kind: error.kind, problem: error.problem });
    } else if (error instanceof FencingError) {
      Object.assign(line, { status: null, error: error.name, detail: error.message });
    } else {
      throw error;
    }
  }
  say(line);
}
process.stdin.destroy(); // an open stdin would keep the process alive
await elector.shutdown();
say({ event: "stopped" });
