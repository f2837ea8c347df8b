//! The admin token check in front of every mutating endpoint.
//!
//! `Authorization: Bearer <http.admin_token>`: missing → 401, wrong → 403, and when no
//! token is configured every mutation is refused with a message saying how to set one.
//! The comparison takes the same time whatever the bytes (it leaks only the length), and
//! the token is never logged.

use super::error::ApiError;
use super::AppState;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;

/// Middleware: lets the request through only with the configured admin token.
pub async fn require_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    check(state.admin_token(), request.headers().get(AUTHORIZATION))?;
    Ok(next.run(request).await)
}

/// The decision, apart from the HTTP plumbing.
pub fn check(
    configured: Option<&str>,
    header: Option<&axum::http::HeaderValue>,
) -> Result<(), ApiError> {
    let expected = configured.ok_or(ApiError::TokenNotConfigured)?;
    let header = header.ok_or(ApiError::Unauthorized)?;
    let value = header.to_str().map_err(|_| ApiError::Unauthorized)?;
    let (scheme, token) = value.split_once(' ').ok_or(ApiError::Unauthorized)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::Unauthorized);
    }
    if tokens_match(token.trim().as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

/// Constant-time equality (for equal lengths; a length mismatch is not secret).
pub fn tokens_match(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && bool::from(given.ct_eq(expected))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn decisions() {
        let ok = HeaderValue::from_static("Bearer s3cret");
        assert!(check(Some("s3cret"), Some(&ok)).is_ok());
        assert!(check(
            Some("s3cret"),
            Some(&HeaderValue::from_static("bearer s3cret"))
        )
        .is_ok());
        assert!(matches!(
            check(Some("s3cret"), None),
            Err(ApiError::Unauthorized)
        ));
        assert!(matches!(
            check(
                Some("s3cret"),
                Some(&HeaderValue::from_static("Basic s3cret"))
            ),
            Err(ApiError::Unauthorized)
        ));
        assert!(matches!(
            check(
                Some("s3cret"),
                Some(&HeaderValue::from_static("Bearer s3creT"))
            ),
            Err(ApiError::Forbidden)
        ));
        assert!(matches!(
            check(Some("s3cret"), Some(&HeaderValue::from_static("Bearer s3"))),
            Err(ApiError::Forbidden)
        ));
        assert!(matches!(
            check(None, Some(&ok)),
            Err(ApiError::TokenNotConfigured)
        ));
    }
}
