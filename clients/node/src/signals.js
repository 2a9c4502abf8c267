// AbortSignal.any where the runtime has it (Node 20.3+), else the same from listeners (Node 18).

export function anySignal(signals) {
  if (typeof AbortSignal.any === "function") return AbortSignal.any(signals);
  const controller = new AbortController();
  const listeners = [];
  const abort = (reason) => {
    for (const [signal, listener] of listeners) signal.removeEventListener("abort", listener);
    controller.abort(reason);
  };
  for (const signal of signals) {
    if (signal.aborted) {
      abort(signal.reason);
      return controller.signal;
    }
    const listener = () => abort(signal.reason);
    listeners.push([signal, listener]);
    signal.addEventListener("abort", listener, { once: true });
  }
  return controller.signal;
}
