//! Fences: a resource's maximum term, its bound lease and when it last moved.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fencing_schema::store::{self};
use serde_json::json;

use crate::control::extract::*;
use crate::control::state::ControlState;
use crate::problem::Problem;
use crate::security::auth::Caller;

pub(super) async fn get_fence(
    State(state): State<ControlState>,
    Extension(caller): Extension<Caller>,
    Path(resource): Path<String>,
) -> Response {
    if let Err(problem) = may_read(&caller) {
        return problem.into_response();
    }
    let call_resource = resource.clone();
    let row = state
        .with_client(|client| async move {
            let result = store::get_fence(&**client, &call_resource).await;
            (client, result)
        })
        .await;
    match row {
        Ok(Some(row)) => axum::Json(json!({
            "resource": row.resource,
            "max_term": row.max_term,
            "lease_key": row.lease_key,
            "updated_at": rfc3339(row.updated_at),
        }))
        .into_response(),
        Ok(None) => Problem::new(
            StatusCode::NOT_FOUND,
            "no-such-fence",
            "No such fence",
            "no write was ever admitted for this resource",
        )
        .with("resource", json!(resource))
        .into_response(),
        Err(problem) => problem.into_response(),
    }
}
