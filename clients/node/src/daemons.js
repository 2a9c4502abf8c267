// Daemons: named background work units run on the live nodes of a cluster, each on one node at a
// time, with the Rust library's rules (docs/election.md, "Daemons"; the Python client's
// daemons.py is the same loop). Once per heartbeat a node heartbeats, runs the leader's pass
// while it holds the cluster's lease, and reads its assignments: it acknowledges before it starts
// a daemon, gives back what runs nowhere, drains a revocation by its deadline (counted from the
// first read that may have returned it), and cancels what moved on. A watchdog cancels every
// daemon half a heartbeat before the node's own registration runs out, on the local clock.
// A daemon is `async (ctx) => {...}`: it should return when ctx.drainSignal or ctx.signal aborts,
// check ctx.isValid() right before each action, and fence its writes with ctx.fencingToken.

import { randomBytes } from "node:crypto";
import { hostname } from "node:os";

import { nowNs } from "./clock.js";
import { ControlClient, DaemonsApi } from "./control.js";
import { Elector } from "./elector.js";
import { Conflict, FencingError } from "./errors.js";

const MS = 1_000_000n;

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

export class DaemonContext {
  #runner;
  #cancel = new AbortController();
  #drain = new AbortController();

  constructor(name, generation, fencingToken, runner) {
    this.name = name;
    this.generation = generation;
    this.fencingToken = fencingToken;
    this.drainDeadlineNs = null;
    this.#runner = runner;
  }

  /** Aborted when the daemon must stop at once (moved on, deadline, registration ran out). */
  get signal() {
    return this.#cancel.signal;
  }

  /** Aborted when the daemon should finish and return (revoked, shutdown); also on cancel. */
  get drainSignal() {
    return this.#drain.signal;
  }

  isDraining() {
    return this.#drain.signal.aborted;
  }

  /** True while this instance may act, read now: not cancelled, before its drain deadline, and
   * its node's registration has not run out. */
  isValid() {
    if (this.#cancel.signal.aborted) return false;
    const now = nowNs();
    if (this.drainDeadlineNs !== null && now >= this.drainDeadlineNs) return false;
    return this.#runner._registered(now + (BigInt(this.#runner.intervalMs) * MS) / 2n);
  }

  _drain() {
    this.#drain.abort();
  }

  _cancel() {
    this.#drain.abort();
    this.#cancel.abort();
  }
}

export class Daemons {
  #control;
  #api;
  #running = new Map();
  #registeredUntil = null;
  #firstUnanswered = null;
  #stopping = false;
  #closing = false;
  #tasks = [];
  #pending = new Set();

  constructor(cluster, daemons, options = {}) {
    this.cluster = cluster;
    this.nodeId = options.nodeId ?? `${hostname()}-${process.pid}`;
    this.intervalMs = options.intervalMs ?? 15_000;
    this.ttlMs = options.ttlMs ?? this.intervalMs * 6;
    this.ackTimeoutMs = options.ackTimeoutMs ?? 30_000;
    this.drainTimeoutMs = options.drainTimeoutMs ?? 60_000;
    for (const [name, value] of [["intervalMs", this.intervalMs], ["ttlMs", this.ttlMs], ["ackTimeoutMs", this.ackTimeoutMs], ["drainTimeoutMs", this.drainTimeoutMs]]) {
      if (!Number.isSafeInteger(value)) throw new RangeError(`${name} must be an integer number of milliseconds`);
    }
    this.logger = options.logger ?? null;
    const names = Object.keys(daemons);
    if (names.length === 0 || names.length > 100 || names.some((name) => name.length === 0 || name.length > 200)) {
      throw new RangeError("daemons: 1 to 100 names of 1 to 200 characters");
    }
    if (this.intervalMs < 10 || this.ttlMs < 3 * this.intervalMs || this.ttlMs < 1000) {
      throw new RangeError("intervalMs at least 10 ms, ttlMs at least three intervals and 1 s");
    }
    for (const [name, value] of [["ackTimeoutMs", this.ackTimeoutMs], ["drainTimeoutMs", this.drainTimeoutMs]]) {
      if (value < 2 * this.intervalMs || value < 1000 || value > 3_600_000) {
        throw new RangeError(`${name} must be at least two heartbeat intervals, and 1 s to 1 h`);
      }
    }
    this.daemons = Object.assign(Object.create(null), daemons);
    this.#control = options.control ?? new ControlClient({ baseUrl: options.controlUrl, token: options.token });
    this.incarnation = randomBytes(8).toString("hex");
    this.#api = new DaemonsApi(this.#control, cluster, this.nodeId, this.incarnation);
    this.elector =
      options.elector ?? new Elector(`${cluster}-leader`, { control: this.#control, ttlMs: Math.max(2 * this.intervalMs, 10_000) });
    if (this.elector.ttlMs < 2 * this.intervalMs) throw new RangeError("the leader's lease must be at least two heartbeat intervals");
  }

  start() {
    if (this.#tasks.length === 0) {
      this.elector.start();
      this.#tasks = [
        this.#guard("heartbeats", this.#heartbeats()),
        this.#guard("loop", this.#loop()),
        this.#guard("watchdog", this.#watchdog()),
      ];
    }
    return this;
  }

  /** The daemons running here: [name, generation]. */
  running() {
    return [...this.#running.entries()].map(([name, r]) => [name, r.ctx.generation]).sort();
  }

  isRegistered() {
    return this._registered(nowNs());
  }

  _registered(now) {
    return this.#registeredUntil !== null && now < this.#registeredUntil;
  }

  /** Releases the lease, drains the daemons (at most the drain timeout, then aborts their
   * signals), gives back the ones that returned, and leaves once none runs. Heartbeats and the
   * watchdog go on until then, so a daemon draining here is never given to another node
   * meanwhile, and one that overruns its deadlines still has its signal aborted. */
  async shutdown() {
    this.#closing = true; // no more acknowledgements, starts or leader passes
    try {
      await this.elector.shutdown();
    } catch {
      // shutdown goes on
    }
    const runs = [...this.#running.values()];
    for (const running of runs) running.ctx._drain();
    if (!(await this.#settled(runs, this.drainTimeoutMs))) {
      for (const running of runs) running.ctx._cancel();
      await this.#settled(runs, this.drainTimeoutMs);
    }
    this.#stopping = true;
    await Promise.allSettled(this.#tasks);
    await Promise.allSettled([...this.#pending]);
    const still = [];
    for (const [name, running] of [...this.#running]) {
      if (running.settled) await this.#giveBack(name, running);
      else still.push(name);
    }
    if (still.length > 0) {
      // Never given back and never left while running: the registration runs out at its ttl
      // (their isValid() turns false then), and only then may another node run them.
      this.#log("error", `daemons ${still.join(", ")} of ${this.cluster} ignored their signals: not leaving`);
      return;
    }
    try {
      await this.#control.leave(this.cluster, this.nodeId, this.incarnation, { timeoutMs: this.intervalMs });
    } catch {
      // Gone at its ttl anyway.
    }
    this.#registeredUntil = null;
  }

  async #settled(runs, ms) {
    let timer;
    const all = Promise.allSettled(runs.map((r) => r.done)).then(() => true);
    const late = new Promise((resolve) => (timer = setTimeout(() => resolve(false), ms)));
    const result = await Promise.race([all, late]);
    clearTimeout(timer);
    return result;
  }

  #log(level, message) {
    this.logger?.[level]?.(message);
  }

  /** The node's registration, on its own schedule: a slow pass never delays it. */
  async #heartbeats() {
    while (!this.#stopping) {
      const sent = nowNs();
      try {
        const registration = await this.#control.heartbeat(this.cluster, this.nodeId, this.incarnation, this.ttlMs, {
          timeoutMs: this.intervalMs,
        });
        this.#registeredUntil = sent + BigInt(registration.remainingMs) * MS;
      } catch (error) {
        if (!(error instanceof FencingError)) throw error;
      }
      await sleep(Math.round(this.intervalMs * (0.8 + Math.random() * 0.2)));
    }
  }

  async #loop() {
    while (!this.#stopping) {
      const started = nowNs();
      if (!this.#closing) await this.#leaderPass(this.intervalMs);
      await this.#readAssignments(this.intervalMs);
      const spent = Number((nowNs() - started) / MS);
      await sleep(Math.max(0, Math.round(this.intervalMs * (0.8 + Math.random() * 0.2)) - spent));
    }
  }

  /** Runs one of the runner's loops; if it fails, the node gives up rather than run daemons
   * without it: it steps down and aborts every daemon. */
  #guard(what, loop) {
    return loop.catch((error) => {
      this.#log("error", `the daemons' ${what} of ${this.cluster} failed: ${error?.stack ?? error}`);
      this.#closing = true;
      this.#registeredUntil = null;
      try {
        this.elector.stepDown("renew_failed");
      } catch {
        // nothing more to end
      }
      for (const running of this.#running.values()) running.ctx._cancel();
    });
  }

  async #leaderPass(limit) {
    let period;
    try {
      period = this.elector.leadership();
    } catch {
      return;
    }
    try {
      // Work of the period: settled before its lease is released.
      await period.run(() =>
        this.#api.reconcile(this.elector.key, period.owner, period.term, this.ackTimeoutMs, this.drainTimeoutMs, {
          timeoutMs: Math.min(limit, period.remainingMs()),
        }),
      );
    } catch (error) {
      if (!(error instanceof FencingError)) throw error;
    }
  }

  async #readAssignments(limit) {
    const sent = nowNs();
    let assignments;
    try {
      assignments = await this.#api.assignments(Object.keys(this.daemons).sort(), { timeoutMs: limit });
    } catch (error) {
      if (!(error instanceof FencingError)) throw error;
      this.#firstUnanswered ??= sent; // the store may have counted this read as the revocation's
      return;
    }
    const countedFrom = this.#firstUnanswered ?? sent;
    this.#firstUnanswered = null;
    const seen = new Map(assignments.map((a) => [a.daemon, a]));
    for (const [name, running] of this.#running) {
      const assignment = seen.get(name);
      if (assignment === undefined || assignment.generation !== running.ctx.generation) {
        running.stoppedSent = true; // not this node's any more: nothing to give back
        running.ctx._cancel();
      }
    }
    for (const assignment of assignments) await this.#act(assignment, countedFrom, limit);
  }

  async #act({ daemon: name, generation, state, remainingMs }, countedFrom, limit) {
    const running = this.#running.get(name);
    const mine = running !== undefined && running.ctx.generation === generation;
    if (state === "assigning" && running === undefined && Object.hasOwn(this.daemons, name) && !this.#closing) {
      let token;
      try {
        token = await this.#api.ack(name, generation, { timeoutMs: limit });
      } catch (error) {
        if (!(error instanceof FencingError)) throw error;
        return; // refused, or no answer: not started
      }
      if (this.#closing || !this.isRegistered()) return; // read as active next time and given back
      this.#start(name, generation, token);
    } else if (state === "active" && running === undefined) {
      await this.#stopped(name, generation, limit);
    } else if (state === "revoking") {
      if (mine) {
        if (!running.revoked) {
          running.revoked = true;
          running.ctx.drainDeadlineNs = countedFrom + BigInt(remainingMs ?? 0) * MS - (BigInt(this.intervalMs) * MS) / 2n;
          running.ctx._drain();
        }
      } else if (running === undefined) {
        await this.#stopped(name, generation, limit);
      }
    }
  }

  #start(name, generation, token) {
    const ctx = new DaemonContext(name, generation, token, this);
    const running = { ctx, revoked: false, stoppedSent: false, settled: false, done: null };
    running.done = Promise.resolve()
      .then(() => this.daemons[name](ctx))
      .catch((error) => this.#log("error", `daemon ${name} generation ${generation} failed: ${error?.message ?? error}`))
      .then(() => {
        running.settled = true;
        ctx._cancel();
        if (this.#stopping || this.#running.get(name) !== running) return;
        const giving = this.#giveBack(name, running);
        this.#pending.add(giving);
        giving.finally(() => this.#pending.delete(giving));
      });
    this.#running.set(name, running);
  }

  async #giveBack(name, running) {
    if (this.#running.get(name) === running) this.#running.delete(name);
    if (!running.stoppedSent) {
      running.stoppedSent = true;
      await this.#stopped(name, running.ctx.generation, this.intervalMs);
    }
  }

  async #stopped(name, generation, limit) {
    try {
      await this.#api.stopped(name, generation, { timeoutMs: limit });
    } catch (error) {
      if (!(error instanceof FencingError)) throw error;
      if (!(error instanceof Conflict)) {
        // Not answered: read as active next time, and given back then.
      }
    }
  }

  async #watchdog() {
    const step = Math.min(this.intervalMs / 8, 50);
    const half = (BigInt(this.intervalMs) * MS) / 2n;
    while (!this.#stopping) {
      const now = nowNs();
      const until = this.#registeredUntil;
      for (const running of this.#running.values()) {
        const drain = running.ctx.drainDeadlineNs;
        if (until === null || now >= until - half || (drain !== null && now >= drain)) running.ctx._cancel();
      }
      await sleep(step);
    }
  }
}
