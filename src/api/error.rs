//! [`ApiError`]: every way a request can fail, and the status and JSON body each maps to.
//!
//! Bodies are `{"error": "..."}`, plus `"field"` when one input field is at fault, so that
//! a client can point at it. Database failures are logged here and answered with a
//! generic message: their text may name tables or hosts, which a caller need not see.

use crate::store::StoreError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// The environment variable that sets `http.admin_token`, named in refusals.
pub const TOKEN_ENV: &str = "PUSHPACE__HTTP__ADMIN_TOKEN";

/// Errors at the HTTP boundary.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("campaign {0:?} not found")]
    CampaignNotFound(String),
    #[error("app {0:?} not found")]
    AppNotFound(String),
    #[error("no route for {0}")]
    NoRoute(String),
    /// The change conflicts with the state (an app that campaigns still send through).
    #[error("{0}")]
    Conflict(String),
    /// What the request needs is not configured (the app registry's master key).
    #[error("{0}")]
    Unavailable(String),
    #[error("missing credentials: send Authorization: Bearer <http.admin_token>")]
    Unauthorized,
    #[error("the admin token does not match")]
    Forbidden,
    #[error(
        "changes and dead letters are disabled: no admin token is configured; set \
         http.admin_token (e.g. {TOKEN_ENV}=<secret>) and restart pushpace"
    )]
    TokenNotConfigured,
    /// The request's `Host` is neither the bound address nor in `http.allowed_hosts`.
    #[error(
        "host {0:?} is not served here: use the address pushpace listens on \
         (127.0.0.1, localhost or [::1] with its port) or add the host to http.allowed_hosts"
    )]
    UnknownHost(String),
    /// An id in the path or query breaks the id rule.
    #[error("invalid {field}: {reason}")]
    InvalidId { field: &'static str, reason: String },
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("could not read the request body: {0}")]
    BadBody(String),
    #[error("storage is unavailable")]
    Store(#[source] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ApiError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::CampaignNotFound(_) | ApiError::AppNotFound(_) | ApiError::NoRoute(_) => {
                StatusCode::NOT_FOUND
            }
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden | ApiError::TokenNotConfigured => StatusCode::FORBIDDEN,
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::InvalidId { .. } => StatusCode::BAD_REQUEST,
            ApiError::UnknownHost(_) => StatusCode::MISDIRECTED_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BadBody(_) => StatusCode::BAD_REQUEST,
            ApiError::Store(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn field(&self) -> Option<&str> {
        match self {
            ApiError::Invalid { field, .. } => Some(field),
            ApiError::InvalidId { field, .. } => Some(field),
            _ => None,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid { field, reason } => ApiError::invalid(field, reason),
            StoreError::CampaignNotFound(id) => ApiError::CampaignNotFound(id),
            other => ApiError::Store(other),
        }
    }
}

#[derive(serde::Serialize)]
struct Body<'a> {
    error: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            ApiError::Store(e) => tracing::error!(error = %e, "request failed in the store"),
            ApiError::Internal(e) => tracing::error!(error = %e, "request failed"),
            _ => {}
        }
        let body = Body {
            error: self.to_string(),
            field: self.field(),
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
