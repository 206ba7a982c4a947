//! The page: `/` redirects to `/dashboard`, plain HTML, CSS and a small
//! script compiled into the binary (`gateway/assets/`); nothing fetched
//! from elsewhere.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::HeaderName;
use axum::response::{IntoResponse, Redirect, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::openapi::AnyRequestErrors;
use crate::AppState;

const HTML: &str = include_str!("../../assets/dashboard.html");
const CSS: &str = include_str!("../../assets/dashboard.css");
const JS: &str = include_str!("../../assets/dashboard.js");

/// Nothing but this gateway: no inline script, no other origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// `/`, `/dashboard` and its assets.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(root))
        .routes(routes!(page))
        .routes(routes!(css))
        .routes(routes!(js))
}

/// To the dashboard.
#[utoipa::path(
    get,
    path = "/",
    operation_id = "root",
    tag = "dashboard",
    responses(
        (status = 303, description = "To `/dashboard`",
            headers(("Location" = String, description = "`/dashboard`"))),
        AnyRequestErrors,
    )
)]
async fn root() -> Redirect {
    Redirect::to("/dashboard")
}

/// A `GET` handler that answers one asset compiled into the binary, with its
/// description: `$name, $path, $operation_id, $description, $media_type,
/// $content_type, $text`.
macro_rules! asset_route {
    ($(#[doc = $doc:tt])* $name:ident, $path:tt, $operation:tt, $description:tt, $media:tt, $content_type:tt, $text:expr) => {
        $(#[doc = $doc])*
        #[utoipa::path(
            get,
            path = $path,
            operation_id = $operation,
            tag = "dashboard",
            responses(
                (status = 200, description = $description, content_type = $media, body = String),
                AnyRequestErrors,
            )
        )]
        async fn $name() -> Response {
            asset($content_type, $text)
        }
    };
}

asset_route!(
    /// The live dashboard: plain HTML, CSS and a small script compiled into the
    /// binary; nothing fetched from elsewhere.
    page,
    "/dashboard",
    "dashboard",
    "The dashboard's page",
    "text/html",
    "text/html; charset=utf-8",
    HTML
);

asset_route!(
    /// The dashboard's style sheet.
    css,
    "/dashboard/dashboard.css",
    "dashboard_css",
    "CSS",
    "text/css",
    "text/css; charset=utf-8",
    CSS
);

asset_route!(
    /// The dashboard's script.
    js,
    "/dashboard/dashboard.js",
    "dashboard_js",
    "JavaScript",
    "text/javascript",
    "text/javascript; charset=utf-8",
    JS
);

fn asset(content_type: &'static str, text: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            // Revalidate, so a new binary's assets are picked up at once.
            (CACHE_CONTROL, "no-cache"),
            (HeaderName::from_static("content-security-policy"), CSP),
            (HeaderName::from_static("x-content-type-options"), "nosniff"),
        ],
        text,
    )
        .into_response()
}
