// The elector against an in-memory gateway: leadership, its end, and bad answers.

import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  ControlClient,
  Elector,
  FencedHttp,
  LossReason,
  NotLeader,
  OutcomeUnknown,
  ProtocolError,
  StaleLeader,
  Unavailable,
} from "../src/index.js";
import { FakeGateway, json, pause, problem } from "./fake.js";

const FAST = { ttlMs: 600, renewMs: 100, marginMs: 60, queryTimeoutMs: 100 };

function elector(fake, settings = {}) {
  return new Elector("jobs", { owner: "node-a", control: new ControlClient({ fetch: fake.fetch }), ...FAST, ...settings });
}

/** The next `count` events, within `ms`. */
function nextEvents(e, count = 1, ms = 3000) {
  return new Promise((resolve, reject) => {
    const seen = [];
    const timer = setTimeout(() => {
      e.off("event", listen);
      reject(new Error(`only ${seen.length} of ${count} events within ${ms} ms: ${JSON.stringify(seen)}`));
    }, ms);
    function listen(event) {
      seen.push(event);
      if (seen.length === count) {
        clearTimeout(timer);
        e.off("event", listen);
        resolve(count === 1 ? seen[0] : seen);
      }
    }
    e.on("event", listen);
  });
}

function eventsWithin(e, ms) {
  const seen = [];
  const listen = (event) => seen.push(event);
  e.on("event", listen);
  return sleep(ms).then(() => {
    e.off("event", listen);
    return seen;
  });
}

test("leads, renews, and owns each period under a fresh owner", async () => {
  const fake = new FakeGateway();
  const e = elector(fake);
  const elected = nextEvents(e);
  e.start();
  const event = await elected;
  assert.equal(event.type, "elected");
  assert.equal(event.term, 1);
  assert.equal(event.owner, `node-a#${e.incarnation}-0`);
  await sleep(350);
  assert.ok(e.isLeader());
  assert.equal(e.currentTerm(), 1);
  assert.ok(fake.verbs("renew").length >= 2, JSON.stringify(fake.calls));
  await e.shutdown();
  assert.ok(!e.isLeader());
  assert.equal(fake.verbs("release").at(-1).owner, event.owner);
  assert.equal(fake.holder, null);
});

test("a refused renewal ends the period, aborts its work, and the next period is new", async () => {
  const fake = new FakeGateway();
  const e = elector(fake);
  let aborted = false;
  e.spawnLeaderWork(async (leadership) => {
    await new Promise((resolve) => leadership.signal.addEventListener("abort", resolve, { once: true }));
    aborted = true;
  });
  const elected = nextEvents(e);
  e.start();
  const first = await elected;
  const lost = nextEvents(e);
  fake.holder = "node-b#x-0";
  fake.term = 2;
  const loss = await lost;
  assert.deepEqual([loss.type, loss.term, loss.reason], ["lost", 1, LossReason.RENEW_REFUSED]);
  await sleep(10);
  assert.ok(aborted, "the period's work was aborted");
  assert.ok(!e.isLeader());
  const again = nextEvents(e);
  fake.holder = null;
  const next = await again;
  assert.equal(next.term, 3);
  assert.notEqual(next.owner, first.owner, "a period ended locally is over: a new owner, a new term");
  const owners = fake.verbs("acquire").map((call) => call.owner);
  assert.ok(!owners.slice(owners.indexOf(next.owner)).includes(first.owner));
  await e.shutdown();
});

test("a renewal that never answers ends the period by its deadline", async () => {
  const fake = new FakeGateway();
  const e = elector(fake);
  const elected = nextEvents(e);
  e.start();
  await elected;
  fake.onRenew = () => new Promise(() => {});
  const loss = await nextEvents(e, 1, 2000);
  assert.ok([LossReason.RENEW_FAILED, LossReason.DEADLINE].includes(loss.reason), loss.reason);
  assert.ok(!e.isLeader());
  await e.shutdown();
});

test("a paused process is not leader before any timer runs, and sends nothing", async () => {
  const fake = new FakeGateway();
  const e = elector(fake, { renewMs: 150 });
  const elected = nextEvents(e);
  e.start();
  await elected;
  const leadership = e.leadership();
  assert.equal(leadership.check(), 1);
  pause(700); // the event loop is blocked: no timer or task runs
  assert.ok(!e.isLeader(), "isLeader reads the clock at the moment of asking");
  assert.throws(() => leadership.check(), NotLeader);
  const sent = fake.writes.length;
  const http = new FencedHttp(e, { fetch: fake.fetch });
  await assert.rejects(http.post("/ledger/acct-1/entries", { json: { n: 1 } }), NotLeader);
  assert.equal(fake.writes.length, sent, "nothing was sent");
  assert.ok(leadership.signal.aborted, "the period's signal is aborted");
  assert.equal(leadership.reason, LossReason.DEADLINE);
  await e.shutdown();
});

for (const [name, answer] of [
  ["a body that is not JSON", () => new Response("{not json", { status: 200 })],
  ["an array", () => json(200, [1, 2])],
  ["another owner", () => json(200, { key: "jobs", owner: "x", term: 1, remaining_ms: 500, ttl_ms: 600 })],
  ["another key", (body) => json(200, { key: "other", owner: body.owner, term: 1, remaining_ms: 500, ttl_ms: 600 })],
  ["more time left than the ttl", (body) => json(200, { key: "jobs", owner: body.owner, term: 1, remaining_ms: 1e9, ttl_ms: 600 })],
  ["another ttl", (body) => json(200, { key: "jobs", owner: body.owner, term: 1, remaining_ms: 500, ttl_ms: 1e9 })],
  ["no term", (body) => json(200, { key: "jobs", owner: body.owner, remaining_ms: 500, ttl_ms: 600 })],
  ["term 0", (body) => json(200, { key: "jobs", owner: body.owner, term: 0, remaining_ms: 500, ttl_ms: 600 })],
  ["a term as a string", (body) => json(200, { key: "jobs", owner: body.owner, term: "1", remaining_ms: 500, ttl_ms: 600 })],
  ["a fractional remaining_ms", (body) => json(200, { key: "jobs", owner: body.owner, term: 1, remaining_ms: 0.5, ttl_ms: 600 })],
  ["a 500", () => new Response("oops", { status: 500 })],
  ["a redirect", () => new Response(null, { status: 302, headers: { location: "http://example.invalid/" } })],
  ["a broken problem", () => new Response("{", { status: 503, headers: { "content-type": "application/problem+json" } })],
  ["a slow answer", () => new Promise(() => {})],
  // Answered after 1 s, within the test's wait: without the call's bound it would be a grant.
  ["a late answer", (body) => sleep(1000).then(() => json(200, { key: "jobs", owner: body.owner, term: 1, remaining_ms: 600, ttl_ms: 600 }))],
]) {
  test(`an answer it does not understand is never leadership: ${name}`, async () => {
    const fake = new FakeGateway();
    fake.onAcquire = answer;
    const e = elector(fake);
    const seen = eventsWithin(e, name === "a late answer" ? 1500 : 500);
    e.start();
    assert.deepEqual(await seen, []);
    assert.ok(!e.isLeader());
    assert.equal(e.currentTerm(), null);
    assert.ok(fake.verbs("acquire").length >= 1);
    await e.shutdown();
  });
}

test("the control client says what was wrong", async () => {
  const fake = new FakeGateway();
  const control = new ControlClient({ fetch: fake.fetch });
  fake.onAcquire = () => new Response("<html>", { status: 200 });
  await assert.rejects(control.acquire("jobs", "a", 1000), (error) => error instanceof ProtocolError && /not JSON/.test(error.message));
  fake.onAcquire = () => new Response("boom", { status: 500 });
  await assert.rejects(control.acquire("jobs", "a", 1000), (error) => error instanceof ProtocolError && /unexpected status 500/.test(error.message));
  fake.onAcquire = () => new Promise(() => {});
  await assert.rejects(control.acquire("jobs", "a", 1000, { timeoutMs: 50 }), (error) => error instanceof Unavailable && /no answer within/.test(error.message));
  const withToken = new ControlClient({ fetch: fake.fetch, token: "s3cret" });
  fake.onAcquire = () => new Response("boom", { status: 500 });
  await assert.rejects(withToken.acquire("jobs", "a", 1000), (error) => !error.message.includes("s3cret"));
});

test("a fenced write refused with 409 throws StaleLeader and ends the period", async () => {
  const fake = new FakeGateway();
  const e = elector(fake);
  const elected = nextEvents(e);
  e.start();
  await elected;
  const http = new FencedHttp(e, { fetch: fake.fetch });
  const ok = await http.post("/ledger/acct-1/entries", { json: { n: 1 } });
  assert.equal(ok.status, 200);
  assert.equal(fake.writes.at(-1).headers.get("fencing-token"), "1");
  fake.onWrite = () => problem(409, "stale-term", { resource: "acct-1", presented_term: 1, current_term: 4 });
  const lost = nextEvents(e);
  await assert.rejects(http.post("/ledger/acct-1/entries", { json: { n: 2 } }), (error) => {
    assert.ok(error instanceof StaleLeader);
    assert.equal(error.kind, "stale-term");
    assert.equal(error.currentTerm, 4);
    assert.equal(error.problem.resource, "acct-1");
    return true;
  });
  const loss = await lost;
  assert.equal(loss.reason, LossReason.FENCED);
  assert.ok(!e.isLeader());
  // An upstream's own 409 (not a fence's problem) is the upstream's answer.
  fake.onWrite = () => json(409, { error: "duplicate" });
  await nextEvents(e);
  const answer = await http.post("/ledger/acct-1/entries", { body: "x" });
  assert.equal(answer.status, 409);
  assert.deepEqual(await answer.json(), { error: "duplicate" });
  assert.ok(e.isLeader());
  await e.shutdown();
});

test("stamp mode presents the lease and the period's owner", async () => {
  const fake = new FakeGateway();
  const e = elector(fake);
  const elected = nextEvents(e);
  e.start();
  const event = await elected;
  await new FencedHttp(e, { mode: "stamp", fetch: fake.fetch }).put("/jobs/x", { resource: "job-7", body: "x" });
  const headers = fake.writes.at(-1).headers;
  assert.equal(headers.get("fencing-lease"), "jobs");
  assert.equal(headers.get("fencing-owner"), event.owner);
  assert.equal(headers.get("fencing-resource"), "job-7");
  assert.equal(headers.get("fencing-token"), null);
  await e.shutdown();
});

test("a write in flight when the period ends is OutcomeUnknown, and its request is aborted", async () => {
  const fake = new FakeGateway();
  const e = elector(fake);
  const elected = nextEvents(e);
  e.start();
  await elected;
  const order = [];
  // A send that takes a moment to stop once aborted.
  const slowFetch = (url, init) =>
    new Promise((resolve, reject) => {
      fake.writes.push({ url, init, headers: new Headers(init.headers) });
      init.signal.addEventListener("abort", () => setTimeout(() => {
        order.push("write stopped");
        reject(init.signal.reason);
      }, 50), { once: true });
    });
  const lease = fake.lease.bind(fake);
  fake.lease = (key, verb, body) => {
    if (verb === "release") order.push("released");
    return lease(key, verb, body);
  };
  fake.holder = "someone-else"; // the next renewal is refused
  const http = new FencedHttp(e, { fetch: slowFetch });
  await assert.rejects(http.post("/ledger/acct-1/entries", { body: "x" }), OutcomeUnknown);
  assert.ok(fake.writes.at(-1).init.signal.aborted, "the request's signal was aborted");
  await sleep(150);
  assert.deepEqual(order.slice(0, 2), ["write stopped", "released"], "no release under a write still going");
  await e.shutdown();
});

test("shutdown waits for leader work before it releases, and keeps the lease when work overruns", async () => {
  const fake = new FakeGateway();
  const e = elector(fake, { shutdownGraceMs: 200 });
  const order = [];
  e.spawnLeaderWork(async (leadership) => {
    await new Promise((resolve) => leadership.signal.addEventListener("abort", resolve, { once: true }));
    await sleep(50);
    order.push("work stopped");
  });
  const elected = nextEvents(e);
  e.start();
  await elected;
  const lease = fake.lease.bind(fake);
  fake.lease = (key, verb, body) => {
    if (verb === "release") order.push("released");
    return lease(key, verb, body);
  };
  await e.shutdown();
  assert.deepEqual(order, ["work stopped", "released"]);

  const stubbornFake = new FakeGateway();
  const s = elector(stubbornFake, { shutdownGraceMs: 100 });
  let finish;
  s.spawnLeaderWork(() => new Promise((resolve) => (finish = resolve))); // ignores its signal
  const sElected = nextEvents(s);
  s.start();
  await sElected;
  await s.shutdown();
  assert.deepEqual(stubbornFake.verbs("release"), []);
  finish();
});

test("a requested handover ends the period, stops its work, releases and waits a ttl", async () => {
  const fake = new FakeGateway();
  const e = elector(fake);
  const order = [];
  e.spawnLeaderWork(async (leadership) => {
    await new Promise((resolve) => leadership.signal.addEventListener("abort", resolve, { once: true }));
    await sleep(50);
    order.push("work stopped");
  });
  const lease = fake.lease.bind(fake);
  fake.lease = (key, verb, body) => {
    if (verb === "release") order.push("released");
    return lease(key, verb, body);
  };
  const elected = nextEvents(e);
  e.start();
  await elected;
  fake.onRenew = async (body) => {
    const answer = await lease("jobs", "renew", body).json();
    return json(200, { ...answer, resign_requested: true });
  };
  const loss = await nextEvents(e);
  assert.equal(loss.reason, LossReason.RESIGNED);
  const acquires = fake.verbs("acquire").length;
  await sleep(400);
  assert.deepEqual(order, ["work stopped", "released"]);
  assert.equal(fake.holder, null);
  assert.equal(fake.verbs("acquire").length, acquires, "it waits a ttl before it tries to lead again");
  await e.shutdown();
});

test("settings that cannot be safe are refused", () => {
  for (const [settings, message] of [
    [{ ttlMs: 50 }, /ttlMs/],
    [{ marginMs: 300 }, /marginMs/],
    [{ marginMs: 10 }, /marginMs/],
    [{ renewMs: 5 }, /renewMs/],
    [{ renewMs: 400, queryTimeoutMs: 200 }, /two thirds/],
    [{ retryMs: 5000 }, /retryMs/],
    [{ shutdownGraceMs: 0 }, /shutdownGraceMs/],
    [{ ttlMs: Number.NaN }, /ttlMs/],
    [{ renewMs: 100.5 }, /renewMs/],
  ]) {
    assert.throws(() => elector(new FakeGateway(), settings), message);
  }
  assert.throws(() => new Elector("jobs", { owner: "a#b" }), /owner/);
});

test("a leader's value is watched, and a zombie cannot set one", async () => {
  const fake = new FakeGateway();
  const control = new ControlClient({ fetch: fake.fetch });
  const stop = new AbortController();
  const changes = control.watchLease("jobs", { waitMs: 200, signal: stop.signal })[Symbol.asyncIterator]();
  assert.equal((await changes.next()).value.revision, 0); // nobody acquired it yet
  const e = elector(fake);
  const elected = nextEvents(e);
  e.start();
  await elected;
  const held = (await changes.next()).value;
  assert.deepEqual([held.term, held.value], [1, null]);
  await e.setValue({ addr: "10.0.0.5:8080" });
  const changed = (await changes.next()).value;
  assert.deepEqual(changed.value, { addr: "10.0.0.5:8080" });
  assert.ok(changed.revision > held.revision);
  fake.holder = "node-b#x-0";
  fake.term = 2;
  await assert.rejects(e.setValue({ addr: "stale" }), NotLeader);
  assert.deepEqual(fake.value, { addr: "10.0.0.5:8080" });
  stop.abort();
  await changes.return();
  await e.shutdown();
});

test("the deadline counts from the send, minus the margin", async () => {
  const fake = new FakeGateway();
  // Answered 30 ms after it was sent, with 600 ms left: at most 510 ms are left once answered.
  fake.onAcquire = () => sleep(30).then(() => null);
  fake.onRenew = () => new Promise(() => {}); // renewals never answer
  const e = elector(fake);
  const elected = nextEvents(e);
  e.start();
  await elected;
  const left = e.leadership().remainingMs();
  assert.ok(left <= 510, `${left} ms left: counted from the answer, or without the margin`);
  await nextEvents(e); // lost
  await e.shutdown();
});

test("a grant with a term it already had is not leadership", async () => {
  const fake = new FakeGateway();
  const e = elector(fake);
  const elected = nextEvents(e);
  e.start();
  await elected;
  const lost = nextEvents(e);
  fake.holder = "someone-else";
  await lost;
  // The store went back: every grant is term 1 again.
  fake.onAcquire = (body) => json(200, { key: "jobs", owner: body.owner, term: 1, remaining_ms: 600, ttl_ms: 600 });
  const releases = fake.verbs("release").length;
  assert.deepEqual(await eventsWithin(e, 500), []);
  assert.ok(!e.isLeader());
  assert.ok(fake.verbs("release").length > releases, "the grant it will not use is released");
  await e.shutdown();
});

test("a listener that throws does not stop the elector", async () => {
  const fake = new FakeGateway();
  const e = elector(fake);
  e.on("elected", () => {
    throw new Error("a listener's bug");
  });
  const elected = nextEvents(e);
  e.start();
  await elected;
  await sleep(300);
  assert.ok(e.isLeader());
  assert.ok(fake.verbs("renew").length >= 2, "it goes on renewing");
  await e.shutdown();
  assert.equal(fake.holder, null);
});
