// The gateway's control API (leases, membership): every call bounded, every answer checked.
// An answer this client does not understand is a ProtocolError, never a grant.

import { Conflict, FencingError, ProblemError, ProtocolError, Unavailable } from "./errors.js";
import { anySignal } from "./signals.js";

function int(body, name, minimum = 0) {
  const value = body?.[name];
  if (!Number.isSafeInteger(value) || value < minimum) {
    throw new ProtocolError(`field ${JSON.stringify(name)} is not an integer >= ${minimum}: ${JSON.stringify(value)}`);
  }
  return value;
}

function str(body, name) {
  const value = body?.[name];
  if (typeof value !== "string") {
    throw new ProtocolError(`field ${JSON.stringify(name)} is not a string: ${JSON.stringify(value)}`);
  }
  return value;
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

const segment = encodeURIComponent;

export class ControlClient {
  /**
   * @param {object} [options]
   * @param {string} [options.baseUrl] the control listener, http://127.0.0.1:9090 by default
   * @param {string} [options.token] a [[clients]] bearer token, sent only in Authorization
   * @param {number} [options.timeoutMs] the default bound of a call
   * @param {typeof fetch} [options.fetch] the fetch to use (tests pass their own)
   */
  constructor({ baseUrl = "http://127.0.0.1:9090", token, timeoutMs = 5000, fetch: fetchImpl } = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.timeoutMs = timeoutMs;
    this.fetch = fetchImpl ?? globalThis.fetch;
    this.headers = { accept: "application/json" };
    if (token != null) this.headers.authorization = `Bearer ${token}`;
  }

  async call(method, path, body, { timeoutMs, expect = 200, signal } = {}) {
    const limit = timeoutMs ?? this.timeoutMs;
    if (!(limit > 0)) throw new Unavailable(`${method} ${path}: no time left`);
    const headers = { ...this.headers };
    if (body !== undefined) headers["content-type"] = "application/json";
    // A timer of our own, not AbortSignal.timeout: that one does not keep the process alive,
    // so a call to a gateway that never answers would leave the caller's promise pending forever.
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(), limit);
    const bound = signal ? anySignal([timeout.signal, signal]) : timeout.signal;
    let response;
    let text;
    let encoded;
    try {
      encoded = body === undefined ? undefined : JSON.stringify(body);
    } catch (error) {
      clearTimeout(timer);
      throw new ProtocolError(`${method} ${path}: the body cannot be sent as JSON: ${error.message}`);
    }
    try {
      response = await this.fetch(this.baseUrl + path, {
        method,
        headers,
        body: encoded,
        redirect: "manual",
        signal: bound,
      });
      text = await response.text();
    } catch (error) {
      if (timeout.signal.aborted) throw new Unavailable(`${method} ${path}: no answer within ${limit} ms`);
      throw new Unavailable(`${method} ${path}: ${error?.name ?? "error"}: ${error?.message ?? error}`);
    } finally {
      clearTimeout(timer);
    }
    try {
      return read(method, path, response, text, expect);
    } catch (error) {
      if (error instanceof FencingError) throw error;
      throw new ProtocolError(`${method} ${path}: ${error?.name ?? "error"} reading the answer`, response.status);
    }
  }

  // Leases

  acquire(key, owner, ttlMs, options = {}) {
    return this.lease("acquire", key, owner, ttlMs, options);
  }

  renew(key, owner, ttlMs, options = {}) {
    return this.lease("renew", key, owner, ttlMs, options);
  }

  async lease(verb, key, owner, ttlMs, { value, timeoutMs, signal } = {}) {
    const body = { owner, ttl_ms: ttlMs };
    if (value !== undefined) body.value = value;
    const answer = await this.call("POST", `/v1/leases/${segment(key)}/${verb}`, body, { timeoutMs, signal });
    if (!isObject(answer)) throw new ProtocolError(`${verb}: the answer is not a JSON object`);
    const lease = {
      key: str(answer, "key"),
      owner: str(answer, "owner"),
      term: int(answer, "term", 1),
      remainingMs: int(answer, "remaining_ms"),
      ttlMs: int(answer, "ttl_ms"),
      resignRequested: answer.resign_requested === true,
      value: answer.value ?? null,
    };
    if (lease.ttlMs !== ttlMs || lease.remainingMs > ttlMs) {
      throw new ProtocolError(`${verb}: asked for a ttl of ${ttlMs} ms, answered ${lease.ttlMs} ms with ${lease.remainingMs} ms left`);
    }
    // With [[clients]], the gateway keeps owners as "<client>/<owner>": accept that spelling.
    if (lease.key !== key || !(lease.owner === owner || lease.owner.endsWith(`/${owner}`))) {
      throw new ProtocolError(`${verb}: asked for ${key} as ${owner}, answered ${lease.key} as ${lease.owner}`);
    }
    return lease;
  }

  /** The lease as GET shows it (owner, term, remaining_ms, value, revision); a key nobody
   * acquired yet is {key, revision: 0}. With `after`, waits up to `waitMs` for a change. */
  async getLease(key, { after, waitMs = 0, timeoutMs, signal } = {}) {
    let path = `/v1/leases/${segment(key)}`;
    if (after != null) path += `?after=${after}&wait=${Math.max(0, Math.floor(waitMs))}ms`;
    let answer;
    try {
      answer = await this.call("GET", path, undefined, { timeoutMs: timeoutMs ?? this.timeoutMs + waitMs, signal });
    } catch (error) {
      if (error instanceof ProblemError && error.status === 404) return { key, revision: 0 };
      throw error;
    }
    if (!isObject(answer)) throw new ProtocolError("lease: the answer is not a JSON object");
    int(answer, "revision");
    return answer;
  }

  /** The lease now, then every change of it, each once. */
  async *watchLease(key, { waitMs = 30_000, signal } = {}) {
    let state = await this.getLease(key, { signal });
    yield state;
    for (;;) {
      const revision = state.revision;
      state = await this.getLease(key, { after: revision, waitMs, signal });
      if (state.revision !== revision) yield state;
    }
  }

  /** Asks the holder of `key` to hand over (to `successor`, an owner as given to its elector):
   * {key, term, successor, outcome}, outcome "requested", or with `forceAfterMs` "stepped_down"
   * or "forced". Conflict (not-held) when nobody holds it. */
  async requestResign(key, reason, { successor, forceAfterMs, timeoutMs } = {}) {
    const body = { reason };
    if (successor != null) body.successor = successor;
    if (forceAfterMs != null) body.force_after_ms = forceAfterMs;
    const answer = await this.call("POST", `/v1/leases/${segment(key)}/resign-request`, body, {
      timeoutMs: timeoutMs ?? this.timeoutMs + (forceAfterMs ?? 0),
      expect: forceAfterMs == null ? 202 : 200,
    });
    if (!isObject(answer)) throw new ProtocolError("resign-request: the answer is not a JSON object");
    str(answer, "outcome");
    return answer;
  }

  /** Sets the holder's value for `term`: Conflict (not-holder) unless that owner holds it. */
  async setValue(key, owner, term, value, { timeoutMs } = {}) {
    await this.call("PUT", `/v1/leases/${segment(key)}/value`, { owner, term, value }, { timeoutMs });
  }

  async release(key, owner, { timeoutMs } = {}) {
    await this.call("POST", `/v1/leases/${segment(key)}/release`, { owner }, { timeoutMs, expect: 204 });
  }

  // Membership

  async heartbeat(cluster, nodeId, incarnation, ttlMs, { name, metadata = {}, timeoutMs } = {}) {
    const body = { incarnation, ttl_ms: ttlMs, metadata };
    if (name != null) body.name = name;
    const path = `/v1/clusters/${segment(cluster)}/nodes/${segment(nodeId)}/heartbeat`;
    const answer = await this.call("POST", path, body, { timeoutMs });
    if (!isObject(answer)) throw new ProtocolError("heartbeat: the answer is not a JSON object");
    const registration = {
      cluster: str(answer, "cluster"),
      nodeId: str(answer, "node_id"),
      remainingMs: int(answer, "remaining_ms"),
      ttlMs: int(answer, "ttl_ms"),
    };
    if (registration.remainingMs > ttlMs) {
      throw new ProtocolError(`heartbeat: asked for a ttl of ${ttlMs} ms, answered ${registration.remainingMs} ms left`);
    }
    if (registration.cluster !== cluster || registration.nodeId !== nodeId) {
      throw new ProtocolError(`heartbeat: asked for ${cluster}/${nodeId}, answered ${registration.cluster}/${registration.nodeId}`);
    }
    return registration;
  }

  async leave(cluster, nodeId, incarnation, { timeoutMs } = {}) {
    const path = `/v1/clusters/${segment(cluster)}/nodes/${segment(nodeId)}/leave`;
    await this.call("POST", path, { incarnation }, { timeoutMs, expect: 204 });
  }

  async members(cluster, { after, waitMs = 0, timeoutMs, signal } = {}) {
    let path = `/v1/clusters/${segment(cluster)}/nodes`;
    if (after != null) path += `?after=${after}&wait=${Math.max(0, Math.floor(waitMs))}ms`;
    const limit = timeoutMs ?? this.timeoutMs + waitMs;
    const answer = await this.call("GET", path, undefined, { timeoutMs: limit, signal });
    if (!isObject(answer) || !Array.isArray(answer.nodes)) throw new ProtocolError("members: the answer has no list of nodes");
    const nodes = answer.nodes.map((node) => {
      if (!isObject(node)) throw new ProtocolError("members: a node is not a JSON object");
      return {
        nodeId: str(node, "node_id"),
        name: typeof node.name === "string" ? node.name : null,
        startedAt: str(node, "started_at"),
        remainingMs: int(node, "remaining_ms"),
        metadata: isObject(node.metadata) ? node.metadata : {},
      };
    });
    return { cluster, revision: int(answer, "revision"), nodes };
  }
}

/** The daemon calls of the control API, for one node incarnation. */
export class DaemonsApi {
  constructor(control, cluster, nodeId, incarnation) {
    this.control = control;
    this.cluster = cluster;
    this.incarnation = incarnation;
    this.base = `/v1/clusters/${segment(cluster)}/nodes/${segment(nodeId)}/assignments`;
  }

  async assignments(daemons, { timeoutMs } = {}) {
    const answer = await this.control.call("POST", this.base, { incarnation: this.incarnation, daemons }, { timeoutMs });
    if (!isObject(answer) || !Array.isArray(answer.assignments)) throw new ProtocolError("assignments: the answer has no list of assignments");
    return answer.assignments.map((entry) => {
      if (!isObject(entry)) throw new ProtocolError("assignments: an assignment is not a JSON object");
      const state = str(entry, "state");
      if (!["assigning", "active", "revoking"].includes(state)) throw new ProtocolError(`assignments: unknown state ${state}`);
      let remainingMs = null;
      if (entry.remaining_ms != null) remainingMs = int(entry, "remaining_ms");
      else if (state !== "active") throw new ProtocolError(`assignments: ${state} without remaining_ms`);
      return { daemon: str(entry, "daemon"), generation: int(entry, "generation", 1), state, remainingMs };
    });
  }

  /** Acknowledges an assignment: the fencing token to start it with. */
  async ack(daemon, generation, { timeoutMs } = {}) {
    const answer = await this.control.call("POST", `${this.base}/${segment(daemon)}/ack`, { incarnation: this.incarnation, generation }, { timeoutMs });
    if (!isObject(answer) || answer.state !== "active") throw new ProtocolError("ack: the answer is not an active assignment");
    if (str(answer, "daemon") !== daemon || int(answer, "generation", 1) !== generation) {
      throw new ProtocolError(`ack: asked for ${daemon} ${generation}, answered ${JSON.stringify(answer)}`);
    }
    const token = int(answer, "fencing_token", 1);
    if (token !== generation) throw new ProtocolError(`ack: ${daemon} generation ${generation} answered the token ${token}`);
    return token;
  }

  async stopped(daemon, generation, { timeoutMs } = {}) {
    await this.control.call("POST", `${this.base}/${segment(daemon)}/stopped`, { incarnation: this.incarnation, generation }, { timeoutMs, expect: 204 });
  }

  async reconcile(lease, owner, term, ackTimeoutMs, drainTimeoutMs, { timeoutMs } = {}) {
    const body = { lease, owner, term, ack_timeout_ms: ackTimeoutMs, drain_timeout_ms: drainTimeoutMs };
    const answer = await this.control.call("POST", `/v1/clusters/${segment(this.cluster)}/reconcile`, body, { timeoutMs });
    if (!isObject(answer) || !Array.isArray(answer.changes)) throw new ProtocolError("reconcile: the answer has no list of changes");
    return answer.changes;
  }
}

function read(method, path, response, text, expect) {
  const status = response.status;
  if (status === expect) {
    if (expect === 204) return null;
    try {
      return JSON.parse(text);
    } catch {
      throw new ProtocolError(`${method} ${path}: ${status} with a body that is not JSON`, status);
    }
  }
  const type = response.headers.get("content-type") ?? "";
  if (type.startsWith("application/problem+json")) {
    let problem = null;
    try {
      problem = JSON.parse(text);
    } catch {
      problem = null;
    }
    if (isObject(problem)) {
      if (status === 409) throw new Conflict(status, problem);
      throw new ProblemError(status, problem);
    }
  }
  throw new ProtocolError(`${method} ${path}: unexpected status ${status}`, status);
}
