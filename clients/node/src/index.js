export { CLOCK_NAME, nowNs } from "./clock.js";
export { ControlClient } from "./control.js";
export { Elector, Leadership, LossReason } from "./elector.js";
export {
  Conflict,
  FencingError,
  NotLeader,
  OutcomeUnknown,
  ProblemError,
  ProtocolError,
  StaleLeader,
  Unavailable,
} from "./errors.js";
export { FENCE_REFUSALS, FencedHttp } from "./fenced.js";
export { Membership } from "./membership.js";
