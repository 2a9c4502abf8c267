// Types of fencing-client (the JavaScript is in the files beside this one).

import { EventEmitter } from "node:events";

export declare const CLOCK_NAME: string;
export declare function nowNs(): bigint;

export declare class FencingError extends Error {}
export declare class NotLeader extends FencingError {}
export declare class OutcomeUnknown extends FencingError {}
export declare class Unavailable extends FencingError {}
export declare class ProtocolError extends FencingError {
  readonly status: number | null;
}
export interface Problem {
  type: string;
  title?: string;
  status?: number;
  detail?: string;
  [field: string]: unknown;
}
export declare class ProblemError extends FencingError {
  readonly status: number;
  readonly problem: Problem;
  /** The problem's short name: "stale-term", "lease-held", ... */
  readonly kind: string;
}
export declare class Conflict extends ProblemError {}
export declare class StaleLeader extends ProblemError {
  readonly currentTerm: number | null;
}

export interface Lease {
  key: string;
  owner: string;
  term: number;
  remainingMs: number;
  ttlMs: number;
  resignRequested: boolean;
  value: unknown;
}
/** A lease as GET shows it (snake_case, as the gateway answers); revision 0: nobody acquired it. */
export interface LeaseState {
  key: string;
  revision: number;
  owner?: string | null;
  term?: number;
  remaining_ms?: number;
  value?: unknown;
  [field: string]: unknown;
}
export interface Registration {
  cluster: string;
  nodeId: string;
  remainingMs: number;
  ttlMs: number;
}
export interface Node {
  nodeId: string;
  name: string | null;
  startedAt: string;
  remainingMs: number;
  metadata: Record<string, unknown>;
}
export interface Members {
  cluster: string;
  revision: number;
  nodes: Node[];
}

export interface CallOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}

export declare class ControlClient {
  constructor(options?: { baseUrl?: string; token?: string; timeoutMs?: number; fetch?: typeof fetch });
  acquire(key: string, owner: string, ttlMs: number, options?: CallOptions & { value?: unknown }): Promise<Lease>;
  renew(key: string, owner: string, ttlMs: number, options?: CallOptions & { value?: unknown }): Promise<Lease>;
  release(key: string, owner: string, options?: { timeoutMs?: number }): Promise<void>;
  getLease(key: string, options?: CallOptions & { after?: number; waitMs?: number }): Promise<LeaseState>;
  watchLease(key: string, options?: { waitMs?: number; signal?: AbortSignal }): AsyncIterable<LeaseState>;
  setValue(key: string, owner: string, term: number, value: unknown, options?: { timeoutMs?: number }): Promise<void>;
  requestResign(
    key: string,
    reason: string,
    options?: { successor?: string; forceAfterMs?: number; timeoutMs?: number },
  ): Promise<{ key: string; term: number; successor: string | null; outcome: "requested" | "stepped_down" | "forced" }>;
  heartbeat(
    cluster: string,
    nodeId: string,
    incarnation: string,
    ttlMs: number,
    options?: { name?: string | null; metadata?: Record<string, unknown>; timeoutMs?: number },
  ): Promise<Registration>;
  leave(cluster: string, nodeId: string, incarnation: string, options?: { timeoutMs?: number }): Promise<void>;
  members(cluster: string, options?: CallOptions & { after?: number; waitMs?: number }): Promise<Members>;
}

export declare const LossReason: {
  readonly RENEW_REFUSED: "renew_refused";
  readonly RENEW_FAILED: "renew_failed";
  readonly DEADLINE: "deadline";
  readonly FENCED: "fenced";
  readonly RESIGNED: "resigned";
  readonly SHUTDOWN: "shutdown";
};
export type LossReason = (typeof LossReason)[keyof typeof LossReason];

export interface Elected {
  type: "elected";
  term: number;
  owner: string;
}
export interface Lost {
  type: "lost";
  term: number;
  owner: string;
  reason: LossReason;
}
export type ElectionEvent = Elected | Lost;

export declare class Leadership {
  readonly term: number;
  readonly owner: string;
  readonly reason: LossReason | null;
  /** Aborted the moment the period ends. */
  readonly signal: AbortSignal;
  readonly ended: boolean;
  isValid(): boolean;
  /** The term if the period holds right now; throws NotLeader otherwise. */
  check(): number;
  remainingMs(): number;
  whenEnded(): Promise<void>;
  run<T>(fn: (signal: AbortSignal) => Promise<T>): Promise<T>;
}

export interface ElectorOptions {
  controlUrl?: string;
  owner?: string;
  ttlMs?: number;
  renewMs?: number;
  retryMs?: number;
  marginMs?: number;
  queryTimeoutMs?: number;
  shutdownGraceMs?: number;
  value?: unknown;
  token?: string;
  control?: ControlClient;
  logger?: { warn?(message: string): void; error?(message: string): void; debug?(message: string): void };
}

export declare class Elector extends EventEmitter {
  constructor(key: string, options?: ElectorOptions);
  readonly key: string;
  readonly incarnation: string;
  readonly owner: string;
  readonly lastTerm: number | null;
  readonly lastOwner: string | null;
  start(): this;
  isLeader(): boolean;
  leadership(): Leadership;
  currentTerm(): number | null;
  events(options?: { signal?: AbortSignal }): AsyncIterable<ElectionEvent>;
  spawnLeaderWork(work: (leadership: Leadership) => Promise<unknown> | unknown): void;
  writeFenced<T>(send: (term: number, signal: AbortSignal) => Promise<T>): Promise<T>;
  setValue(value: unknown): Promise<void>;
  stepDown(reason?: LossReason, term?: number | null): void;
  shutdown(): Promise<void>;
  on(event: "elected", listener: (event: Elected) => void): this;
  on(event: "lost", listener: (event: Lost) => void): this;
  on(event: "event", listener: (event: ElectionEvent) => void): this;
}

export declare const FENCE_REFUSALS: ReadonlySet<string>;

export interface FencedRequest {
  resource?: string;
  headers?: Record<string, string>;
  body?: BodyInit;
  json?: unknown;
  force?: boolean;
}

export declare class FencedHttp {
  constructor(
    elector: Elector,
    options?: { proxyUrl?: string; mode?: "verify" | "stamp"; token?: string; timeoutMs?: number; fetch?: typeof fetch },
  );
  request(method: string, path: string, options?: FencedRequest): Promise<Response>;
  post(path: string, options?: FencedRequest): Promise<Response>;
  put(path: string, options?: FencedRequest): Promise<Response>;
  delete(path: string, options?: FencedRequest): Promise<Response>;
}

export interface MembershipOptions {
  controlUrl?: string;
  nodeId?: string;
  name?: string;
  metadata?: Record<string, unknown>;
  intervalMs?: number;
  ttlMs?: number;
  marginMs?: number;
  token?: string;
  control?: ControlClient;
}

export declare class Membership extends EventEmitter {
  constructor(cluster: string, options?: MembershipOptions);
  readonly cluster: string;
  readonly nodeId: string;
  readonly incarnation: string;
  start(): this;
  isRegistered(): boolean;
  members(): Node[];
  shutdown(): Promise<void>;
  on(event: "joined", listener: (node: Node) => void): this;
  on(event: "left" | "identity-conflict", listener: (event: { nodeId: string }) => void): this;
}

/** AbortSignal.any where the runtime has it, else the same from listeners. */
export declare function anySignal(signals: AbortSignal[]): AbortSignal;

export declare class DaemonContext {
  readonly name: string;
  readonly generation: number;
  /** The daemon's fencing token (its generation): present it on every write. */
  readonly fencingToken: number;
  /** Aborted when the daemon must stop at once (moved on, a deadline, the registration ran out). */
  readonly signal: AbortSignal;
  /** Aborted when the daemon should finish and return (revoked, shutdown), and on `signal`. */
  readonly drainSignal: AbortSignal;
  isDraining(): boolean;
  /** True while this instance may act, read now. */
  isValid(): boolean;
}

export interface DaemonsOptions {
  controlUrl?: string;
  token?: string;
  nodeId?: string;
  elector?: Elector;
  intervalMs?: number;
  ttlMs?: number;
  ackTimeoutMs?: number;
  drainTimeoutMs?: number;
  control?: ControlClient;
}

export declare class Daemons {
  constructor(cluster: string, daemons: Record<string, (ctx: DaemonContext) => Promise<unknown>>, options?: DaemonsOptions);
  readonly cluster: string;
  readonly nodeId: string;
  readonly incarnation: string;
  readonly elector: Elector;
  start(): this;
  running(): Array<[string, number]>;
  isRegistered(): boolean;
  shutdown(): Promise<void>;
}
