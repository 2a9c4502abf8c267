// The daemon runner against an in-memory gateway: what it starts, gives back, drains and aborts.

import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { ControlClient, Daemons, Elector } from "../src/index.js";
import { FakeGateway, json, problem } from "./fake.js";

function runner(fake, log, daemon) {
  const fallback = async (ctx) => {
    log.push(`start ${ctx.name} ${ctx.generation} token ${ctx.fencingToken}`);
    await new Promise((resolve) => ctx.drainSignal.addEventListener("abort", resolve, { once: true }));
    log.push(ctx.signal.aborted ? `cancelled ${ctx.name} ${ctx.generation}` : `drained ${ctx.name} ${ctx.generation}`);
  };
  const control = new ControlClient({ fetch: fake.fetch });
  const elector = new Elector("workers-leader", { owner: "n1", control, ttlMs: 1000, renewMs: 200, marginMs: 100, queryTimeoutMs: 200 });
  return new Daemons("workers", { d1: daemon ?? fallback }, {
    nodeId: "n1",
    elector,
    intervalMs: 100,
    ttlMs: 1000,
    ackTimeoutMs: 1000,
    drainTimeoutMs: 1000,
    control,
  });
}

const assigning = (generation) => ({ daemon: "d1", generation, state: "assigning", remaining_ms: 1000 });
const steps = (fake, verb) => fake.calls.filter((call) => call.verb === verb);

test("a daemon starts only after its acknowledgement was accepted", async () => {
  for (const refusal of [
    () => problem(409, "assignment-moved"),
    () => problem(503, "store-unavailable"),
    () => json(200, { daemon: "d1", generation: 4, state: "active", fencing_token: 9 }),
    () => new Response("{", { status: 200 }),
  ]) {
    const fake = new FakeGateway();
    fake.assignments = [assigning(4)];
    fake.onAck = refusal;
    const log = [];
    const node = runner(fake, log).start();
    await sleep(400);
    assert.ok(steps(fake, "ack").length > 0, "it acknowledged");
    assert.deepEqual(log, [], "started without an accepted acknowledgement");
    assert.deepEqual(node.running(), []);
    await node.shutdown();
  }
});

test("acknowledged, revoked, moved on, and given back when read as active but not running", async () => {
  const fake = new FakeGateway();
  fake.assignments = [assigning(4)];
  const log = [];
  const node = runner(fake, log).start();
  await sleep(300);
  assert.deepEqual(log, ["start d1 4 token 4"]);
  assert.deepEqual(node.running(), [["d1", 4]]);
  fake.assignments = [{ daemon: "d1", generation: 4, state: "revoking", remaining_ms: 1000 }];
  await sleep(300);
  assert.equal(log.at(-1), "drained d1 4");
  assert.deepEqual(steps(fake, "stopped").map((c) => c.generation), [4]);
  fake.assignments = [assigning(6)];
  await sleep(300);
  assert.equal(log.at(-1), "start d1 6 token 6");
  fake.assignments = [];
  await sleep(300);
  assert.equal(log.at(-1), "cancelled d1 6");
  assert.deepEqual(steps(fake, "stopped").map((c) => c.generation), [4], "moved on: not given back");
  fake.assignments = [{ daemon: "d1", generation: 7, state: "active", remaining_ms: null }];
  await sleep(300);
  assert.ok(steps(fake, "stopped").some((c) => c.generation === 7));
  assert.equal(log.at(-1), "cancelled d1 6", "never started");
  await node.shutdown();
});

test("shutdown never gives back or leaves while a daemon runs", async () => {
  const fake = new FakeGateway();
  fake.assignments = [assigning(4)];
  let release;
  const stubborn = () => new Promise((resolve) => (release = resolve)); // ignores its signals
  const node = runner(fake, [], stubborn);
  node.drainTimeoutMs = 200; // shutdown's waits, short for the test
  node.start();
  await sleep(300);
  const beats = steps(fake, "heartbeat").length;
  try {
    await node.shutdown();
    assert.ok(steps(fake, "heartbeat").length > beats + 1, "it kept heartbeating while the daemon drained");
    assert.deepEqual(steps(fake, "stopped"), []);
    assert.deepEqual(steps(fake, "leave"), []);
  } finally {
    release();
  }
});
