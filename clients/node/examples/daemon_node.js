// A node of a cluster that runs daemons d1..dN through the gateway, printing JSON lines (the
// same as clients/python/examples/daemon_node.py):
//
//   node examples/daemon_node.js --cluster workers --node-id n1 --daemons 4
//
// Each running daemon, every tick, writes POST /jobs/tick through the gateway's proxy with its
// generation as Fencing-Token and Fencing-Resource: ticks-<daemon>, and stops at a 409. A line
// "shutdown" on stdin (or SIGTERM) drains the daemons, gives them back, releases and leaves.

import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

import { Daemons, Elector, anySignal } from "../src/index.js";

const { values: args } = parseArgs({
  options: {
    control: { type: "string", default: "http://127.0.0.1:9090" },
    proxy: { type: "string", default: "http://127.0.0.1:8080" },
    cluster: { type: "string" },
    "node-id": { type: "string" },
    key: { type: "string" },
    daemons: { type: "string", default: "5" },
    "heartbeat-ms": { type: "string", default: "15000" },
    "registration-ttl-ms": { type: "string" },
    "ttl-ms": { type: "string", default: "60000" },
    "ack-ms": { type: "string", default: "30000" },
    "drain-ms": { type: "string", default: "60000" },
    "tick-ms": { type: "string", default: "100" },
    // For the tests: daemons that never ask isValid(), so only the runner's watchdog stops them.
    "no-validity-check": { type: "boolean", default: false },
  },
});
const say = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);
const nodeId = args["node-id"];
const tickMs = Number(args["tick-ms"]);

async function daemon(ctx) {
  say({ event: "daemon_started", daemon: ctx.name, generation: ctx.generation });
  let n = 0;
  try {
    while (!ctx.isDraining() && (args["no-validity-check"] || ctx.isValid())) {
      n += 1;
      let status = null;
      try {
        const answer = await fetch(`${args.proxy}/jobs/tick`, {
          method: "POST",
          headers: {
            "fencing-token": String(ctx.fencingToken),
            "fencing-resource": `ticks-${ctx.name}`,
            "x-request-id": `${nodeId}-${ctx.name}-${ctx.generation}-${n}`,
          },
          body: "",
          signal: anySignal([ctx.signal, AbortSignal.timeout(2000)]), // stopped the moment the daemon is
        });
        status = answer.status;
        await answer.arrayBuffer();
      } catch {
        status = null;
      }
      if (status === 409) {
        say({ event: "tick_refused", daemon: ctx.name, generation: ctx.generation });
        return;
      }
      await new Promise((resolve) => {
        const done = () => {
          clearTimeout(timer);
          ctx.drainSignal.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, tickMs);
        ctx.drainSignal.addEventListener("abort", done, { once: true });
      });
    }
  } finally {
    say({ event: "daemon_stopped", daemon: ctx.name, generation: ctx.generation });
  }
}

const daemons = {};
for (let i = 1; i <= Number(args.daemons); i += 1) daemons[`d${i}`] = daemon;
const elector = new Elector(args.key ?? `${args.cluster}-leader`, { controlUrl: args.control, owner: nodeId, ttlMs: Number(args["ttl-ms"]) });
elector.on("event", (event) => say({ event: event.type, term: event.term, reason: event.reason }));
const runner = new Daemons(args.cluster, daemons, {
  controlUrl: args.control,
  nodeId,
  elector,
  intervalMs: Number(args["heartbeat-ms"]),
  ttlMs: args["registration-ttl-ms"] === undefined ? undefined : Number(args["registration-ttl-ms"]),
  ackTimeoutMs: Number(args["ack-ms"]),
  drainTimeoutMs: Number(args["drain-ms"]),
});
say({ event: "started", node_id: nodeId, incarnation: runner.incarnation });
runner.start();

await new Promise((resolve) => {
  process.once("SIGTERM", resolve);
  const lines = createInterface({ input: process.stdin });
  lines.on("line", (line) => line.trim() === "shutdown" && resolve());
  lines.on("close", resolve);
});
process.stdin.destroy();
await runner.shutdown();
say({ event: "stopped" });
process.exit(0);
