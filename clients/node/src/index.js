export { CLOCK_NAME, nowNs } from "./clock.js";
export { ControlClient, DaemonsApi } from "./control.js";
export { DaemonContext, Daemons } from "./daemons.js";
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
export { anySignal } from "./signals.js";
