// The client's errors: one base class, and what each failure means for leadership.

export class FencingError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** This process does not lead (or its period ended): nothing was sent. */
export class NotLeader extends FencingError {}

/** The period ended while a write was in flight: it may or may not arrive. */
export class OutcomeUnknown extends FencingError {}

/** The gateway could not be reached, or did not answer in time. */
export class Unavailable extends FencingError {}

/** The gateway answered something this client does not understand. Never taken as leadership. */
export class ProtocolError extends FencingError {
  constructor(message, status = null) {
    super(message);
    this.status = status;
  }
}

/** The gateway refused a call with an application/problem+json answer. */
export class ProblemError extends FencingError {
  constructor(status, problem) {
    const kind = problemKind(problem);
    super(`${status} ${kind}: ${problem.detail ?? problem.title ?? ""}`);
    this.status = status;
    this.problem = problem;
    this.kind = kind;
  }
}

/** A 409 from the control API: held by another owner, a lock-delay, not the holder. */
export class Conflict extends ProblemError {}

/** A fenced write refused with 409 (stale-term, not-leader, future-term): nothing was
 * forwarded, and the local period has ended. */
export class StaleLeader extends ProblemError {
  get currentTerm() {
    const value = this.problem.current_term;
    return Number.isSafeInteger(value) ? value : null;
  }
}

export function problemKind(problem) {
  const type = problem?.type;
  const prefix = "urn:fencing-gateway:problem:";
  if (typeof type === "string" && type.startsWith(prefix)) return type.slice(prefix.length);
  return type == null ? "unknown" : String(type);
}
