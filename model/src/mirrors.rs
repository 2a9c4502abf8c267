//! Which code each transition mirrors: SQL functions in `schema/functions/*.sql` and Rust
//! functions of the gateway and the elector. A test reads those files and fails when one of the
//! names is gone, so the model cannot drift silently from the code.

use crate::protocol::ActionKind;

/// A piece of code a transition mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mirror {
    /// `fencing.<name>`, defined in one of `schema/functions/*.sql`.
    Sql(&'static str),
    /// `fn <name>` in the file at `path`, relative to the workspace root.
    Rust { path: &'static str, name: &'static str },
}

const FENCE_STORE: &str = "gateway/src/fence/mod.rs";
const GRANTS: &str = "gateway/src/fence/grants.rs";
const SETTLES: &str = "gateway/src/fence/settles.rs";
const FORWARD: &str = "gateway/src/proxy/forward.rs";
const ELECTOR: &str = "election/src/runtime.rs";

/// What `kind` mirrors.
pub fn mirrors(kind: ActionKind) -> &'static [Mirror] {
    use Mirror::{Rust, Sql};
    match kind {
        ActionKind::Tick => &[
            Rust { path: GRANTS, name: "sweep" },
            Rust { path: ELECTOR, name: "spawn_watchdog" },
            Rust { path: FORWARD, name: "forward" },
            Rust { path: SETTLES, name: "mark_after" },
            Sql("mark_settled"),
            Sql("mark_drained"),
        ],
        ActionKind::StepClock => &[Sql("remaining_ms")],
        ActionKind::Crash | ActionKind::Flush => &[Sql("commit_durably")],
        ActionKind::ElectorAcquire => &[Rust { path: ELECTOR, name: "acquire" }],
        ActionKind::ElectorRenew => &[Rust { path: ELECTOR, name: "lead" }],
        ActionKind::ElectorRelease => {
            &[Rust { path: ELECTOR, name: "finish_leading" }, Rust { path: ELECTOR, name: "release" }]
        }
        ActionKind::ElectorLost => &[Rust { path: ELECTOR, name: "discard" }],
        ActionKind::StoreAcquire => &[
            Sql("acquire"),
            Sql("lease_grant_ms"),
            Sql("sleep_ms"),
            Sql("commit_durably"),
            Rust { path: ELECTOR, name: "acquire" },
            Rust { path: ELECTOR, name: "deadline" },
        ],
        ActionKind::StoreAcquireWakes => &[
            Sql("acquire"),
            Sql("commit_durably"),
            Rust { path: ELECTOR, name: "acquire" },
            Rust { path: ELECTOR, name: "deadline" },
        ],
        ActionKind::StoreRenew => &[
            Sql("renew"),
            Sql("commit_durably"),
            Rust { path: ELECTOR, name: "lead" },
            Rust { path: ELECTOR, name: "deadline" },
        ],
        ActionKind::StoreRelease => &[Sql("release"), Sql("lease_grant_ms")],
        ActionKind::GatewayDecide => &[
            Rust { path: FENCE_STORE, name: "decide" },
            Rust { path: GRANTS, name: "admit" },
            Rust { path: GRANTS, name: "lasts" },
            Rust { path: GRANTS, name: "covers" },
            Rust { path: GRANTS, name: "under" },
        ],
        ActionKind::GatewayStampWrite => &[
            Rust { path: FENCE_STORE, name: "decide" },
            Rust { path: GRANTS, name: "admit" },
            Rust { path: GRANTS, name: "covers" },
            Rust { path: GRANTS, name: "under" },
        ],
        ActionKind::GateStamp => &[Sql("gate_lease"), Sql("gate_many")],
        ActionKind::GatewayLost => &[Rust { path: "gateway/src/fence/batcher.rs", name: "gate_many" }],
        ActionKind::GateRead => &[Sql("gate"), Sql("gate_many"), Sql("commit_durably")],
        ActionKind::GateGrant => {
            &[Sql("gate"), Sql("fence_lock_id"), Sql("lease_lock_id"), Sql("remaining_ms"), Sql("lease_refusal")]
        }
        ActionKind::GateLock => {
            &[Sql("gate"), Sql("await_grants"), Sql("lease_refusal"), Sql("next_settle"), Sql("commit_durably")]
        }
        ActionKind::GateWakes => &[Sql("await_grants"), Sql("sleep_ms"), Sql("lease_refusal"), Sql("next_settle")],
        ActionKind::GateCommit => {
            &[Sql("gate_many"), Sql("commit_durably"), Rust { path: "gateway/src/fence/batcher.rs", name: "gate_many" }]
        }
        ActionKind::GateAbort => &[Sql("gate_many"), Rust { path: "gateway/src/fence/batcher.rs", name: "gate_many" }],
        ActionKind::GatewayCheck => &[Rust { path: FORWARD, name: "send" }],
        ActionKind::GatewaySend => &[Rust { path: FORWARD, name: "send" }, Rust { path: FORWARD, name: "forward" }],
        ActionKind::GatewayGaveUp => &[Rust { path: "gateway/src/fence/batcher.rs", name: "gate_many" }],
        ActionKind::ElectorGaveUp => &[Rust { path: ELECTOR, name: "lead" }, Rust { path: ELECTOR, name: "acquire" }],
        ActionKind::StoreOrphan => &[Sql("acquire"), Sql("renew"), Sql("release"), Sql("sleep_ms")],
        ActionKind::SqlAdmit => &[Sql("admit"), Sql("try_admit"), Sql("lease_refusal")],
        ActionKind::SqlLock => &[Sql("try_admit"), Sql("await_grants"), Sql("lease_refusal")],
        ActionKind::SqlWakes => &[Sql("await_grants"), Sql("sleep_ms"), Sql("lease_refusal")],
        ActionKind::SqlCommit => &[Sql("next_settle"), Sql("commit_durably")],
        ActionKind::AdminRuns => &[
            Sql("advance_fence"),
            Sql("bind"),
            Sql("rebind"),
            Sql("force_release"),
            Sql("lock_for_admin"),
            Sql("await_admin_grants"),
            Sql("await_grants"),
            Sql("lease_grant_ms"),
            Sql("next_settle"),
            Sql("commit_durably"),
        ],
        ActionKind::AdminWakes => {
            &[Sql("await_admin_grants"), Sql("await_grants"), Sql("sleep_ms"), Sql("next_settle")]
        }
    }
}

/// What every answer a gateway handles mirrors (part of the `Gate*` steps that answer).
pub const GATEWAY_ANSWER: &[Mirror] = &[
    Mirror::Rust { path: FENCE_STORE, name: "decide" },
    Mirror::Rust { path: FENCE_STORE, name: "remember" },
    Mirror::Rust { path: GRANTS, name: "record" },
    Mirror::Rust { path: GRANTS, name: "install" },
    Mirror::Rust { path: SETTLES, name: "wait" },
];
