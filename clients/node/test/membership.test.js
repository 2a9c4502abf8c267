// Membership against an in-memory gateway.

import assert from "node:assert/strict";
import { once } from "node:events";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { ControlClient, Membership } from "../src/index.js";
import { FakeGateway, pause } from "./fake.js";

function node(fake, nodeId) {
  return new Membership("workers", { nodeId, intervalMs: 100, ttlMs: 1000, control: new ControlClient({ fetch: fake.fetch }) });
}

test("heartbeats register, observers hear joins and leaves, and a pause unregisters", async () => {
  const fake = new FakeGateway();
  const a = node(fake, "a");
  const joinedA = once(a, "joined");
  a.start();
  assert.equal((await joinedA)[0].nodeId, "a");
  await sleep(20);
  assert.ok(a.isRegistered());
  assert.deepEqual(new Set(fake.verbs("heartbeat").map((call) => call.incarnation)), new Set([a.incarnation]));
  const b = node(fake, "b");
  const joinedB = once(a, "joined");
  b.start();
  assert.equal((await joinedB)[0].nodeId, "b");
  const left = once(a, "left");
  await b.shutdown();
  assert.deepEqual((await left)[0], { nodeId: "b" });
  pause(1000); // past the registration: no timer ran
  assert.ok(!a.isRegistered());
  await a.shutdown();
});

test("a second process with the same node id hears an identity conflict", async () => {
  const fake = new FakeGateway();
  const first = node(fake, "a").start();
  await sleep(150);
  const second = node(fake, "a");
  const conflict = once(second, "identity-conflict");
  second.start();
  assert.deepEqual((await conflict)[0], { nodeId: "a" });
  assert.ok(!second.isRegistered());
  assert.ok(first.isRegistered());
  await second.shutdown();
  await first.shutdown();
});
