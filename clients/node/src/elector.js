// Leader election through the gateway's lease API, with the Rust library's semantics.
//
// - Every period has an owner of its own, `<owner>#<incarnation>-<n>`: a period this process
//   ended locally is over, and its next leadership is a new period with a new term (S2).
// - Acquire with exponential backoff and full jitter while a follower; renew every ttl/3
//   (jittered up to 20% early) while leader; step down the moment a renewal fails, is refused or
//   times out, or the local deadline passes.
// - The deadline is the instant the last successful acquire or renewal was sent, plus the
//   remaining_ms the store answered, minus the margin (clock.js). Leadership.check() reads the
//   clock at the moment of acting, so a process paused past its lease finds itself not leader
//   before any timer has run.
// - Leader work gets the period's AbortSignal, aborted the moment the period ends; shutdown waits
//   for the work (bounded by the shutdown grace) and releases the lease only when it is done.

import { EventEmitter, on } from "node:events";
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";

import { nowNs } from "./clock.js";
import { ControlClient } from "./control.js";
import { Conflict, FencingError, NotLeader, OutcomeUnknown } from "./errors.js";
import { anySignal } from "./signals.js";

const MS = 1_000_000n;

export const LossReason = Object.freeze({
  RENEW_REFUSED: "renew_refused",
  RENEW_FAILED: "renew_failed",
  DEADLINE: "deadline",
  FENCED: "fenced",
  RESIGNED: "resigned",
  SHUTDOWN: "shutdown",
});

function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, Math.max(0, ms));
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** One leadership period: its term, owner and deadline, and a signal aborted when it ends. */
export class Leadership {
  #elector;
  #controller = new AbortController();
  #endedPromise;
  #resolveEnded;
  #watchdog = null;

  constructor(elector, term, owner, deadlineNs) {
    this.term = term;
    this.owner = owner;
    this.reason = null;
    this.#elector = elector;
    this.deadlineNs = deadlineNs;
    this.works = new Set();
    this.#endedPromise = new Promise((resolve) => {
      this.#resolveEnded = resolve;
    });
    this.#arm();
  }

  /** Aborted the moment the period ends. */
  get signal() {
    return this.#controller.signal;
  }

  get ended() {
    return this.#controller.signal.aborted;
  }

  /** True while the period has not ended and its deadline, read now, has not passed. */
  isValid() {
    return !this.ended && nowNs() < this.deadlineNs;
  }

  /** The term if this period holds right now, else throws NotLeader. Call it right before acting. */
  check() {
    if (this.ended) throw new NotLeader(`the period of term ${this.term} ended (${this.reason})`);
    if (nowNs() >= this.deadlineNs) {
      this.#elector._end(this, LossReason.DEADLINE);
      throw new NotLeader(`the period of term ${this.term} passed its local deadline`);
    }
    return this.term;
  }

  /** Milliseconds to the local deadline (0 once ended). */
  remainingMs() {
    if (this.ended) return 0;
    const left = this.deadlineNs - nowNs();
    return left > 0n ? Number(left / 1000n) / 1000 : 0;
  }

  /** Resolves when the period has ended. */
  whenEnded() {
    return this.#endedPromise;
  }

  /** Runs fn(signal) within this period: NotLeader if it has ended (fn never called),
   * OutcomeUnknown if it ends while fn's promise is pending (the signal is aborted then). */
  async run(fn) {
    this.check();
    const END = Symbol("ended");
    const work = Promise.resolve().then(() => fn(this.signal));
    // One of the period's works: the elector releases the lease only once it has settled.
    const settled = work.then(
      () => {},
      () => {},
    );
    this.works.add(settled);
    settled.then(() => this.works.delete(settled));
    let outcome;
    try {
      outcome = await Promise.race([work, this.#endedPromise.then(() => END)]);
    } catch (error) {
      if (this.ended && !(error instanceof FencingError)) {
        throw new OutcomeUnknown(`the period of term ${this.term} ended while the work was in flight`, { cause: error });
      }
      throw error;
    }
    if (outcome === END) {
      work.catch(() => {});
      throw new OutcomeUnknown(`the period of term ${this.term} ended while the work was in flight`);
    }
    return outcome;
  }

  _setDeadline(deadlineNs) {
    this.deadlineNs = deadlineNs;
    this.#arm();
  }

  _finish(reason) {
    if (this.ended) return false;
    this.reason = reason;
    clearTimeout(this.#watchdog);
    this.#resolveEnded();
    this.#controller.abort(new NotLeader(`the period of term ${this.term} ended (${reason})`));
    return true;
  }

  #arm() {
    clearTimeout(this.#watchdog);
    const left = Number((this.deadlineNs - nowNs()) / MS);
    this.#watchdog = setTimeout(() => {
      if (!this.ended && nowNs() >= this.deadlineNs) this.#elector._end(this, LossReason.DEADLINE);
      else if (!this.ended) this.#arm();
    }, Math.max(0, left) + 1);
  }
}

function validate(s, key, owner) {
  for (const name of ["ttlMs", "renewMs", "retryMs", "marginMs", "queryTimeoutMs", "shutdownGraceMs"]) {
    if (!Number.isSafeInteger(s[name])) throw new RangeError(`${name} must be an integer number of milliseconds`);
  }
  const checks = [
    [s.ttlMs >= 100 && s.ttlMs <= 3_600_000, "ttlMs must be 100 ms to 1 h"],
    [key.length > 0 && key.length <= 200, "key must be 1 to 200 characters"],
    [owner.length > 0 && owner.length <= 200 && !owner.includes("#"), "owner must be 1 to 200 characters without '#'"],
    [s.marginMs * 2 < s.ttlMs, "marginMs must be less than half the ttl"],
    [s.marginMs >= Math.max(50, Math.floor(s.ttlMs / 1000)), "marginMs must be at least 50 ms (or ttl/1000)"],
    [s.renewMs >= 10 && s.retryMs >= 10, "renewMs and retryMs must be at least 10 ms"],
    [s.retryMs <= s.ttlMs, "retryMs must be at most the ttl"],
    [s.queryTimeoutMs > 0, "queryTimeoutMs must be positive"],
    [(s.renewMs + s.queryTimeoutMs) * 3 <= (s.ttlMs - s.marginMs) * 2, "renewMs + queryTimeoutMs must be at most two thirds of ttl minus margin"],
    [s.shutdownGraceMs > 0 && s.shutdownGraceMs <= s.ttlMs, "shutdownGraceMs must be positive and at most the ttl"],
  ];
  for (const [ok, message] of checks) {
    if (!ok) throw new RangeError(message);
  }
}

/**
 * Holds one lease key for this process through the gateway's control API. Events: "elected"
 * ({term, owner}), "lost" ({term, owner, reason}); `events()` gives both as an async iterator.
 */
export class Elector extends EventEmitter {
  #control;
  #period = null;
  #periods = 0;
  #works = [];
  #stop = new AbortController();
  #runner = null;
  #lastTerm = null;
  #lastOwner = null;

  constructor(key, options = {}) {
    super();
    const ttlMs = options.ttlMs ?? 10_000;
    this.key = key;
    this.ttlMs = ttlMs;
    this.renewMs = options.renewMs ?? Math.floor(ttlMs / 3);
    this.retryMs = options.retryMs ?? this.renewMs;
    this.marginMs = options.marginMs ?? Math.max(50, Math.floor(ttlMs / 10), Math.floor(ttlMs / 1000));
    this.queryTimeoutMs = options.queryTimeoutMs ?? Math.floor(ttlMs / 5);
    this.shutdownGraceMs = options.shutdownGraceMs ?? Math.floor(ttlMs / 2);
    const prefix = options.owner ?? `${hostname()}-${process.pid}`;
    validate(this, key, prefix);
    this.prefix = prefix;
    this.incarnation = randomBytes(6).toString("hex");
    this.value = options.value;
    this.logger = options.logger ?? null;
    this.#control = options.control ?? new ControlClient({ baseUrl: options.controlUrl, token: options.token });
  }

  /** The owner of the current (or next) period. */
  get owner() {
    return `${this.prefix}#${this.incarnation}-${this.#periods}`;
  }

  get lastTerm() {
    return this.#lastTerm;
  }

  get lastOwner() {
    return this.#lastOwner;
  }

  start() {
    this.#runner ??= this.#run();
    return this;
  }

  /** True only while a period holds at this very moment (its deadline read now). */
  isLeader() {
    return this.#period !== null && this.#period.isValid();
  }

  /** The current period; throws NotLeader when there is none right now. */
  leadership() {
    const period = this.#period;
    if (period === null) throw new NotLeader(`not leader of ${this.key}`);
    period.check();
    return period;
  }

  currentTerm() {
    return this.isLeader() ? this.#period.term : null;
  }

  /** Every elected and lost event from now on, in order. */
  async *events({ signal } = {}) {
    for await (const [event] of on(this, "event", { signal })) yield event;
  }

  /** Runs work(leadership) at the start of every period (now, if leading); its signal
   * (leadership.signal) is aborted the moment that period ends. */
  spawnLeaderWork(work) {
    this.#works.push(work);
    if (this.isLeader()) this.#startWork(this.#period, work);
  }

  /** Calls send(term, signal) within the current period: NotLeader if there is none (nothing
   * sent), OutcomeUnknown if it ends while the send is in flight. */
  async writeFenced(send) {
    const period = this.leadership();
    return period.run((signal) => send(period.term, signal));
  }

  /** Sets this leader's value for the current term: NotLeader when no period holds, or the
   * store says this owner no longer holds that term. */
  async setValue(value) {
    const period = this.leadership();
    try {
      await this.#control.setValue(this.key, period.owner, period.term, value, {
        timeoutMs: Math.min(this.queryTimeoutMs, period.remainingMs()),
      });
    } catch (error) {
      if (error instanceof Conflict) throw new NotLeader(`the store refused the value of term ${period.term}: ${error.message}`);
      throw error;
    }
    this.value = value;
  }

  /** Ends the current period (of `term`, when given) locally; the next leadership is a new term. */
  stepDown(reason = LossReason.FENCED, term = null) {
    const period = this.#period;
    if (period !== null && (term === null || period.term === term)) this._end(period, reason);
  }

  /** Stops leader work (bounded by the shutdown grace), then releases the lease, unless the work
   * overran the grace. */
  async shutdown() {
    this.#stop.abort();
    if (this.#runner) {
      const limit = this.shutdownGraceMs + this.queryTimeoutMs + 1000;
      const cancel = new AbortController();
      await Promise.race([this.#runner, sleep(limit, cancel.signal)]);
      cancel.abort();
    }
  }

  _end(period, reason) {
    if (!period._finish(reason)) return;
    if (this.#period === period) this.#period = null;
    this.#emit({ type: "lost", term: period.term, owner: period.owner, reason });
  }

  #emit(event) {
    // A listener that throws must not stop the elector (or end a period's timer halfway).
    for (const name of [event.type, "event"]) {
      try {
        this.emit(name, event);
      } catch (error) {
        this.#log("error", `a listener of ${name} threw: ${error?.message ?? error}`);
      }
    }
  }

  #log(level, message) {
    this.logger?.[level]?.(message);
  }

  async #run() {
    try {
      await this.#elect();
    } finally {
      // However the loop ends (shutdown, or a failure nobody expected), no period outlives it.
      const period = this.#period;
      if (period !== null) {
        this._end(period, this.#stop.signal.aborted ? LossReason.SHUTDOWN : LossReason.RENEW_FAILED);
        if (await this.#drain(period)) await this.#release(period.owner);
      }
    }
  }

  async #elect() {
    let backoffMs = 25;
    const stop = this.#stop.signal;
    while (!stop.aborted) {
      const owner = this.owner;
      const sent = nowNs();
      let lease;
      try {
        lease = await this.#control.acquire(this.key, owner, this.ttlMs, { value: this.value, timeoutMs: this.queryTimeoutMs });
      } catch (error) {
        if (error instanceof Conflict) {
          const delay = error.problem.lock_delay_remaining_ms;
          const wait = Number.isSafeInteger(delay) ? Math.min(Math.max(delay, 10), this.retryMs) : this.retryMs;
          await sleep(wait * (0.5 + Math.random() / 2), stop);
          backoffMs = 25;
        } else {
          this.#log("warn", `acquire of ${this.key} failed: ${error.message}`);
          await sleep(Math.random() * backoffMs, stop);
          backoffMs = Math.min(backoffMs * 2, this.retryMs);
        }
        continue;
      }
      const deadline = sent + BigInt(lease.remainingMs - this.marginMs) * MS;
      if (deadline <= nowNs() || (this.#lastTerm !== null && lease.term <= this.#lastTerm)) {
        // Too late to act on, or a term this process already had (an answer replayed, a store
        // gone back): a period it never starts. The next attempt is a new owner, after a pause.
        this.#log("warn", `acquire of ${this.key} answered term ${lease.term} too late or not above ${this.#lastTerm}: not leading`);
        await this.#release(owner); // held for nobody otherwise, until it expires
        this.#periods += 1;
        await sleep(Math.random() * backoffMs, stop);
        backoffMs = Math.min(backoffMs * 2, this.retryMs);
        continue;
      }
      backoffMs = 25;
      if (stop.aborted) {
        await this.#release(owner);
        break;
      }
      const period = new Leadership(this, lease.term, owner, deadline);
      this.#period = period;
      this.#lastTerm = lease.term;
      this.#lastOwner = owner;
      this.#emit({ type: "elected", term: lease.term, owner });
      for (const work of this.#works) this.#startWork(period, work);
      const reason = lease.resignRequested ? LossReason.RESIGNED : await this.#hold(period);
      this._end(period, reason);
      const drained = await this.#drain(period);
      this.#periods += 1;
      if (drained) await this.#release(owner);
      else this.#log("error", `leader work of ${this.key} did not stop within the shutdown grace: not releasing`);
      if (reason === LossReason.RESIGNED) await sleep(this.ttlMs, stop);
    }
    this.#period = null;
  }

  async #hold(period) {
    const stop = this.#stop.signal;
    for (;;) {
      const wait = this.renewMs * (0.8 + Math.random() * 0.2);
      await Promise.race([sleep(wait, anySignal([stop, period.signal])), period.whenEnded()]);
      if (period.ended) return period.reason;
      if (stop.aborted) return LossReason.SHUTDOWN;
      const limit = Math.min(this.queryTimeoutMs, period.remainingMs());
      const sent = nowNs();
      let lease;
      try {
        lease = await this.#control.renew(this.key, period.owner, this.ttlMs, { timeoutMs: limit, signal: period.signal });
      } catch (error) {
        if (period.ended) return period.reason;
        this.#log("warn", `renewal of ${this.key} term ${period.term}: ${error.message}`);
        return error instanceof Conflict ? LossReason.RENEW_REFUSED : LossReason.RENEW_FAILED;
      }
      if (period.ended) return period.reason;
      // Answered after the deadline: the period is over, never extended back into being.
      if (nowNs() >= period.deadlineNs) return LossReason.DEADLINE;
      if (lease.term !== period.term) return LossReason.RENEW_FAILED;
      period._setDeadline(sent + BigInt(lease.remainingMs - this.marginMs) * MS);
      if (lease.resignRequested) return LossReason.RESIGNED;
      if (!period.isValid()) return LossReason.DEADLINE;
    }
  }

  async #drain(period) {
    if (period.works.size === 0) return true;
    const all = Promise.allSettled([...period.works]).then(() => true);
    const cancel = new AbortController();
    const drained = await Promise.race([all, sleep(this.shutdownGraceMs, cancel.signal).then(() => false)]);
    cancel.abort();
    return drained;
  }

  async #release(owner) {
    try {
      await this.#control.release(this.key, owner, { timeoutMs: this.queryTimeoutMs });
    } catch (error) {
      this.#log("debug", `release of ${this.key}: ${error.message}`);
    }
  }

  #startWork(period, work) {
    const running = Promise.resolve()
      .then(() => work(period))
      .catch((error) => {
        if (period.ended || error instanceof NotLeader) return;
        this.#log("error", `leader work of ${this.key} term ${period.term} failed: ${error?.message ?? error}`);
      })
      .finally(() => period.works.delete(running));
    period.works.add(running);
  }
}
