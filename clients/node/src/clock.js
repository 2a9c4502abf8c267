// The clock local deadlines are measured on.
//
// A deadline must keep counting while the host or VM is suspended. Node exposes no such clock:
// process.hrtime and performance.now read CLOCK_MONOTONIC, which stops during a suspend on Linux.
// So this counts the larger of how far the monotonic clock and the wall clock moved since start:
// a suspend shows on the wall clock, a step of the wall clock backwards is covered by the
// monotonic one, and a step forwards only ends a period early, never late. It never goes back.

const mono0 = process.hrtime.bigint();
const wall0 = BigInt(Date.now()) * 1_000_000n;
let last = 0n;

/** Nanoseconds elapsed on a clock that counts through suspend; only differences mean anything. */
export function nowNs() {
  const mono = process.hrtime.bigint() - mono0;
  const wall = BigInt(Date.now()) * 1_000_000n - wall0;
  const elapsed = mono > wall ? mono : wall;
  if (elapsed > last) last = elapsed;
  return last;
}

/** Milliseconds on the same clock, as a number. */
export function nowMs() {
  return Number(nowNs() / 1000n) / 1000;
}

export const CLOCK_NAME = "max(monotonic, wall) since start";
