// Fenced writes through the gateway's proxy listener: sent only while the elector's period
// holds, with its term (verify) or its lease and owner (stamp), aborted with OutcomeUnknown if
// the period ends in flight. A fence's 409 (stale-term, not-leader, future-term) throws
// StaleLeader with the problem's details and ends the local period.

import { LossReason } from "./elector.js";
import { FencingError, NotLeader, OutcomeUnknown, StaleLeader, Unavailable, problemKind } from "./errors.js";
import { anySignal } from "./signals.js";

export const FENCE_REFUSALS = new Set(["stale-term", "not-leader", "future-term"]);
const NULL_BODY = new Set([101, 204, 205, 304]);
/** Errors that mean no byte of the request left this process. */
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "UND_ERR_CONNECT_TIMEOUT"]);

export class FencedHttp {
  /**
   * @param {import("./elector.js").Elector} elector
   * @param {object} [options]
   * @param {string} [options.proxyUrl] the proxy listener, http://127.0.0.1:8080 by default
   * @param {"verify"|"stamp"} [options.mode]
   * @param {string} [options.token] a [[clients]] bearer token
   * @param {number} [options.timeoutMs] a write's bound (and its period's end)
   * @param {typeof fetch} [options.fetch]
   */
  constructor(elector, { proxyUrl = "http://127.0.0.1:8080", mode = "verify", token, timeoutMs = 5000, fetch: fetchImpl } = {}) {
    if (mode !== "verify" && mode !== "stamp") throw new RangeError("mode must be 'verify' or 'stamp'");
    this.elector = elector;
    this.mode = mode;
    this.proxyUrl = proxyUrl.replace(/\/+$/, "");
    this.timeoutMs = timeoutMs;
    this.fetch = fetchImpl ?? globalThis.fetch;
    this.token = token;
  }

  /**
   * Sends one fenced write and returns the upstream's answer as a Response (any status but a
   * fence's 409). `force` sends with the last term (or owner) even when this process no longer
   * leads: only to show that the fence refuses a zombie; it never bypasses the fence itself.
   */
  async request(method, path, { resource, headers = {}, body, json, force = false } = {}) {
    let term;
    let owner;
    let period = null;
    if (force) {
      term = this.elector.lastTerm;
      owner = this.elector.lastOwner ?? this.elector.owner;
      if (term == null) throw new NotLeader("this process never led: no term to present");
    } else {
      period = this.elector.leadership();
      term = period.term;
      owner = period.owner;
    }
    const sent = { ...headers };
    if (this.token != null) sent.authorization = `Bearer ${this.token}`;
    if (this.mode === "verify") {
      sent["fencing-token"] = String(term);
    } else {
      sent["fencing-lease"] = this.elector.key;
      sent["fencing-owner"] = owner;
    }
    if (resource != null) sent["fencing-resource"] = resource;
    if (json !== undefined) {
      body = JSON.stringify(json);
      sent["content-type"] ??= "application/json";
    }
    const timeout = new AbortController(); // keeps the process alive, unlike AbortSignal.timeout
    const timer = setTimeout(() => timeout.abort(), this.timeoutMs);
    const send = async (periodSignal) => {
      const signal = periodSignal ? anySignal([timeout.signal, periodSignal]) : timeout.signal;
      const response = await this.fetch(this.proxyUrl + path, { method, headers: sent, body, redirect: "manual", signal });
      return { response, text: await response.text() };
    };
    let answer;
    try {
      answer = period ? await period.run(send) : await send(null);
    } catch (error) {
      if (error instanceof FencingError) throw error;
      if (timeout.signal.aborted) throw new OutcomeUnknown(`${method} ${path}: no answer within ${this.timeoutMs} ms`, { cause: error });
      if (NOT_SENT.has(error?.cause?.code)) {
        throw new Unavailable(`${method} ${path}: not sent: ${error.cause.code}`, { cause: error });
      }
      // Sent, or maybe sent: the gateway may have forwarded it.
      throw new OutcomeUnknown(`${method} ${path}: ${error?.message ?? error}`, { cause: error });
    } finally {
      clearTimeout(timer);
    }
    const { response, text } = answer;
    if (response.status === 409 && (response.headers.get("content-type") ?? "").startsWith("application/problem+json")) {
      let problem = null;
      try {
        problem = JSON.parse(text);
      } catch {
        problem = null;
      }
      if (problem !== null && typeof problem === "object" && FENCE_REFUSALS.has(problemKind(problem))) {
        this.elector.stepDown(LossReason.FENCED, term);
        throw new StaleLeader(409, problem);
      }
    }
    return new Response(NULL_BODY.has(response.status) ? null : text, { status: response.status, headers: response.headers });
  }

  post(path, options) {
    return this.request("POST", path, options);
  }

  put(path, options) {
    return this.request("PUT", path, options);
  }

  delete(path, options) {
    return this.request("DELETE", path, options);
  }
}
