//! The CPUs this process may run on: the configuration's defaults for the proxy threads, and
//! the listener's pinning of them.

/// The CPUs this process may run on, in order (all it sees when it cannot tell).
pub fn allowed() -> Vec<usize> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false)).collect(),
        Err(_) => (0..std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)).collect(),
    }
}

/// Keeps the calling thread on `cpu`.
pub fn pin_current_thread(cpu: usize) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}
