// Cluster membership over the control API, with the Rust library's semantics: heartbeats with an
// incarnation new at every start (a second process with the same node id hears
// "identity-conflict"), isRegistered() on the boot clock, and joins and leaves from the watch.

import { EventEmitter } from "node:events";
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";

import { nowNs } from "./clock.js";
import { ControlClient } from "./control.js";
import { Conflict, FencingError } from "./errors.js";

const MS = 1_000_000n;

function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}

/** Events: "joined" (node), "left" ({nodeId}), "identity-conflict" ({nodeId}). */
export class Membership extends EventEmitter {
  #control;
  #stop = new AbortController();
  #registeredUntil = null;
  #members = new Map();
  #tasks = [];

  constructor(cluster, options = {}) {
    super();
    this.cluster = cluster;
    this.nodeId = options.nodeId ?? `${hostname()}-${process.pid}`;
    this.name = options.name ?? null;
    this.metadata = options.metadata ?? {};
    this.intervalMs = options.intervalMs ?? 15_000;
    this.ttlMs = options.ttlMs ?? this.intervalMs * 6;
    this.marginMs = options.marginMs ?? Math.max(50, Math.floor(this.ttlMs / 10));
    for (const [name, value] of [["intervalMs", this.intervalMs], ["ttlMs", this.ttlMs], ["marginMs", this.marginMs]]) {
      if (!Number.isSafeInteger(value)) throw new RangeError(`${name} must be an integer number of milliseconds`);
    }
    if (this.intervalMs < 10) throw new RangeError("intervalMs must be at least 10 ms");
    if (this.ttlMs < 3 * this.intervalMs) throw new RangeError("ttlMs must be at least three heartbeat intervals");
    if (this.ttlMs < 1000) throw new RangeError("ttlMs must be at least 1 s over HTTP");
    this.incarnation = randomBytes(8).toString("hex");
    this.#control = options.control ?? new ControlClient({ baseUrl: options.controlUrl, token: options.token });
  }

  start() {
    if (this.#tasks.length === 0) this.#tasks = [this.#heartbeats(), this.#watch()];
    return this;
  }

  /** True while the last accepted heartbeat has not run out on the local clock. */
  isRegistered() {
    return this.#registeredUntil !== null && nowNs() < this.#registeredUntil;
  }

  /** The live nodes as last read. */
  members() {
    return [...this.#members.values()];
  }

  /** Stops heartbeating and leaves now: the others hear "left" at once. */
  async shutdown() {
    this.#stop.abort();
    await Promise.allSettled(this.#tasks);
    this.#registeredUntil = null;
    try {
      await this.#control.leave(this.cluster, this.nodeId, this.incarnation, { timeoutMs: this.intervalMs });
    } catch {
      // Gone at its ttl anyway.
    }
  }

  async #heartbeats() {
    const stop = this.#stop.signal;
    while (!stop.aborted) {
      const sent = nowNs();
      try {
        const registration = await this.#control.heartbeat(this.cluster, this.nodeId, this.incarnation, this.ttlMs, {
          name: this.name,
          metadata: this.metadata,
          timeoutMs: this.intervalMs,
        });
        this.#registeredUntil = sent + BigInt(registration.remainingMs - this.marginMs) * MS;
      } catch (error) {
        if (error instanceof Conflict && error.kind === "node-id-in-use") {
          this.emit("identity-conflict", { nodeId: this.nodeId });
        } else if (!(error instanceof FencingError)) {
          throw error;
        }
      }
      await sleep(this.intervalMs * (0.8 + Math.random() * 0.2), stop);
    }
  }

  async #watch() {
    const stop = this.#stop.signal;
    let after = 0;
    while (!stop.aborted) {
      let members;
      const asked = nowNs();
      try {
        members = await this.#control.members(this.cluster, { after, waitMs: 30_000, signal: stop });
      } catch (error) {
        if (!(error instanceof FencingError)) throw error;
        await sleep(Math.min(this.intervalMs, 1000), stop);
        continue;
      }
      this.#apply(members.nodes);
      if (members.revision === after && nowNs() - asked < 1000n * MS) {
        // Unchanged, and answered at once instead of waiting: do not ask again at once.
        await sleep(Math.min(this.intervalMs, 1000), stop);
      }
      after = members.revision;
    }
  }

  #apply(nodes) {
    const now = new Map(nodes.map((node) => [node.nodeId, node]));
    for (const [nodeId, old] of this.#members) {
      const fresh = now.get(nodeId);
      if (fresh === undefined || fresh.startedAt !== old.startedAt) this.emit("left", { nodeId });
    }
    for (const [nodeId, node] of now) {
      const old = this.#members.get(nodeId);
      if (old === undefined || old.startedAt !== node.startedAt) this.emit("joined", node);
    }
    this.#members = now;
  }
}
