//! The dashboard page and its static assets, compiled into the binary: the overview
//! (`/`), a campaign's page (`#/campaign/ID`) and the apps page (`#/apps`, read with
//! the admin token the page asks for).
//!
//! uPlot (MIT, by Leon Sorokin) is vendored from the npm registry's `uplot` package as
//! `assets/uPlot.iife.min.js`, `assets/uPlot.min.css` and its licence. The page loads
//! nothing from anywhere else, and the Content-Security-Policy says so.

use super::AppState;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/dashboard.js");
const COMMON: &str = include_str!("assets/common.js");
const CAMPAIGN: &str = include_str!("assets/campaign.js");
const APPS: &str = include_str!("assets/apps.js");
const STYLE: &str = include_str!("assets/dashboard.css");
const UPLOT_JS: &str = include_str!("assets/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("assets/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("assets/uPlot.LICENSE");

const CSP: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; \
                   base-uri 'none'; form-action 'none'";

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/assets/dashboard.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/assets/common.js",
            get(|| async { asset("text/javascript; charset=utf-8", COMMON) }),
        )
        .route(
            "/assets/campaign.js",
            get(|| async { asset("text/javascript; charset=utf-8", CAMPAIGN) }),
        )
        .route(
            "/assets/apps.js",
            get(|| async { asset("text/javascript; charset=utf-8", APPS) }),
        )
        .route(
            "/assets/dashboard.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/assets/uPlot.iife.min.js",
            get(|| async { asset("text/javascript; charset=utf-8", UPLOT_JS) }),
        )
        .route(
            "/assets/uPlot.min.css",
            get(|| async { asset("text/css; charset=utf-8", UPLOT_CSS) }),
        )
        .route(
            "/assets/uPlot.LICENSE",
            get(|| async { asset("text/plain; charset=utf-8", UPLOT_LICENSE) }),
        )
}
