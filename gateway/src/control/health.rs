//! Health and metrics: `/healthz`, `/readyz` (Postgres answers, the schema is this binary's, and
//! the store's clock agrees with this host's), `/metrics`, and the answer to an unknown path.

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fencing_schema::store::{self};
use serde_json::json;

use crate::control::extract::*;
use crate::control::state::ControlState;
use crate::metrics as names;
use crate::problem::Problem;
use crate::security::auth::Caller;

pub(super) async fn render_metrics(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
) -> Response {
    if let Err(problem) = may_read(&caller) {
        return problem.into_response();
    }
    // Refusals inside Postgres roll back with their transactions: the store counts them in a
    // sequence, read here (bounded) so the dashboard sees them whichever client was refused.
    let count = state
        .sql_refusals
        .get(|| async {
            state
                .with_client(|client| async move {
                    let result = store::sql_refusal_count(&**client).await;
                    (client, result)
                })
                .await
                .ok()
        })
        .await;
    if let Some(count) = count {
        metrics::counter!(names::SQL_REFUSALS).absolute(u64::try_from(count).unwrap_or(0));
    }
    let mut response = state.metrics.render().into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}

pub(super) async fn healthz() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

pub(super) async fn readyz(State(state): State<ControlState>) -> Response {
    let version = state
        .readiness
        .get(|| async {
            state
                .with_client(|client| async move {
                    let result = fencing_schema::check_schema_version(&**client).await;
                    (client, result)
                })
                .await
        })
        .await;
    match version {
        // Writes are admitted only while the clocks agree (`fence::clock`).
        Ok(_) if !state.fences.clocks_agree() => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "fence-store-unavailable",
            "Fence store unavailable",
            "this gateway's clock and the fence store's have not agreed long enough (at start-up, or after a \
             disagreement): writes get 503 until they do",
        )
        .retry_after(1)
        .into_response(),
        Ok(version) => axum::Json(json!({ "status": "ready", "schema_version": version })).into_response(),
        Err(problem) => problem.into_response(),
    }
}

pub(super) async fn not_found() -> Response {
    Problem::new(StatusCode::NOT_FOUND, "not-found", "Not found", "no such control endpoint").into_response()
}
