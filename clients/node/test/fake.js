// An in-memory stand-in for the gateway's control and proxy listeners, as a fetch function,
// for the unit tests: it can refuse, stall, or answer garbage on purpose.

export function problem(status, kind, extra = {}) {
  const body = { type: `urn:fencing-gateway:problem:${kind}`, title: kind, status, detail: kind, ...extra };
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/problem+json" } });
}

export function json(status, body) {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
}

/** Blocks the event loop for `ms`: no timer, no task runs (a paused process, as the loop sees it). */
export function pause(ms) {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

export class FakeGateway {
  constructor() {
    this.holder = null;
    this.term = 0;
    this.calls = [];
    this.writes = [];
    this.onAcquire = null;
    this.onRenew = null;
    this.onWrite = null;
    this.value = null;
    this.nodes = new Map();
    this.assignments = [];
    this.onAck = null;
    this.revision = 1;
    this.fetch = (url, init = {}) => this.handle(new URL(url), init);
  }

  verbs(verb) {
    return this.calls.filter((call) => call.verb === verb);
  }

  async handle(url, init) {
    const path = url.pathname;
    const signal = init.signal;
    if (signal?.aborted) throw signal.reason;
    const answer = await Promise.race([
      this.answer(url, path, init),
      new Promise((_, reject) => signal?.addEventListener("abort", () => reject(signal.reason), { once: true })),
    ]);
    return answer;
  }

  async answer(url, path, init) {
    const body = init.body && path.startsWith("/v1/") ? JSON.parse(init.body) : {};
    if (path.startsWith("/v1/leases/") && path.split("/").length === 4) {
      const key = path.split("/")[3];
      if (this.term === 0) return problem(404, "no-such-lease", { revision: 0 });
      if (url.searchParams.get("after") === String(this.revision)) await new Promise((resolve) => setTimeout(resolve, 50));
      return json(200, { key, owner: this.holder, term: this.term, value: this.value, revision: this.revision });
    }
    if (path.startsWith("/v1/leases/")) {
      const [, , , key, verb] = path.split("/");
      this.calls.push({ verb, ...body });
      const hook = { acquire: this.onAcquire, renew: this.onRenew }[verb];
      if (hook) {
        const answer = await hook(body);
        if (answer) return answer;
      }
      return this.lease(key, verb, body);
    }
    if (path.startsWith("/v1/clusters/")) {
      if ((init.method ?? "GET") === "GET" && url.searchParams.get("after") === String(this.revision)) {
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      return this.cluster(init, path, body);
    }
    this.writes.push({ url, init, headers: new Headers(init.headers) });
    if (this.onWrite) {
      const answer = await this.onWrite(init);
      if (answer) return answer;
    }
    return json(200, { ok: true });
  }

  lease(key, verb, body) {
    const owner = body.owner;
    if (verb === "value") {
      if (this.holder !== owner || body.term !== this.term) return problem(409, "not-holder");
      this.value = body.value;
      this.revision += 1;
      return json(200, { key, term: this.term, value: this.value });
    }
    if (verb === "acquire") {
      if (this.holder !== null && this.holder !== owner) return problem(409, "lease-held", { holder: this.holder, term: this.term });
      if (this.holder === null) {
        this.term += 1;
        this.holder = owner;
        this.value = null;
        this.revision += 1;
      }
    } else if (verb === "renew") {
      if (this.holder !== owner) return problem(409, "not-holder", { holder: this.holder, term: this.term });
    } else if (verb === "release") {
      if (this.holder !== owner) return problem(409, "not-holder");
      this.holder = null;
      this.revision += 1;
      return new Response(null, { status: 204 });
    }
    return json(200, {
      key,
      owner,
      term: this.term,
      remaining_ms: body.ttl_ms,
      ttl_ms: body.ttl_ms,
      expires_at: "2026-11-28T00:00:00Z",
      resign_requested: false,
    });
  }

  cluster(init, path, body) {
    const parts = path.split("/");
    const cluster = parts[3];
    if ((init.method ?? "GET") === "GET") {
      const nodes = [...this.nodes].map(([nodeId, node]) => ({
        node_id: nodeId,
        name: null,
        started_at: node.startedAt,
        remaining_ms: 1000,
        metadata: {},
      }));
      return json(200, { cluster, nodes, revision: this.revision });
    }
    if (parts.length === 5 && parts[4] === "reconcile") {
      this.calls.push({ verb: "reconcile", ...body });
      return json(200, { cluster, term: body.term, changes: [] });
    }
    const [node, verb] = [parts[5], parts[6]];
    if (verb === "assignments" && parts.length === 7) {
      this.calls.push({ verb: "read-assignments", node });
      return json(200, { cluster, node_id: node, assignments: this.assignments.map((a) => ({ ...a })) });
    }
    if (verb === "assignments" && parts.length === 9) {
      const [daemon, step] = [parts[7], parts[8]];
      this.calls.push({ verb: step, daemon, ...body });
      if (step === "ack") {
        if (this.onAck) return this.onAck(daemon, body);
        for (const a of this.assignments) {
          if (a.daemon === daemon && a.generation === body.generation) Object.assign(a, { state: "active", remaining_ms: null });
        }
        return json(200, { daemon, generation: body.generation, state: "active", fencing_token: body.generation, waited_ms: 0 });
      }
      this.assignments = this.assignments.filter((a) => !(a.daemon === daemon && a.generation === body.generation));
      return new Response(null, { status: 204 });
    }
    this.calls.push({ verb, node, ...body });
    if (verb === "heartbeat") {
      const known = this.nodes.get(node);
      if (known && known.incarnation !== body.incarnation) return problem(409, "node-id-in-use");
      if (!known) {
        this.nodes.set(node, { incarnation: body.incarnation, startedAt: `t${this.revision}` });
        this.revision += 1;
      }
      return json(200, { cluster, node_id: node, remaining_ms: body.ttl_ms, ttl_ms: body.ttl_ms });
    }
    if (verb === "leave") {
      this.nodes.delete(node);
      this.revision += 1;
      return new Response(null, { status: 204 });
    }
    return new Response(null, { status: 404 });
  }
}
