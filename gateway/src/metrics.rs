//! Prometheus metrics, in a registry owned by [`crate::AppState`] (not a
//! global), so two gateways in one test process count separately.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

use crate::AppState;

/// The outcome label of a response: handlers and [`crate::ApiError`] put one
/// in the response's extensions; the middleware counts it.
#[derive(Debug, Clone, Copy)]
pub struct Outcome(pub &'static str);

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "gateway_requests_total",
                "Requests by method and outcome (accepted, stale, stale_token, issuer_mismatch, ...).",
            ),
            &["method", "outcome"],
        )
        .expect("valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "gateway_request_duration_seconds",
                "Request latency, from the first byte read to the response.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["method"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(requests.clone()))
            .expect("register once");
        registry
            .register(Box::new(latency.clone()))
            .expect("register once");
        Self {
            registry,
            requests,
            latency,
        }
    }

    /// The Prometheus text format.
    pub fn render(&self) -> Response {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            return crate::ApiError::Internal(format!("encode metrics: {e}")).into_response();
        }
        ([(CONTENT_TYPE, encoder.format_type().to_string())], buf).into_response()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Middleware: count every response by its outcome and time it.
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    // Known methods only, so a client cannot grow the label set.
    let method: &'static str = match req.method().as_str() {
        "GET" => "GET",
        "PUT" => "PUT",
        "POST" => "POST",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        _ => "other",
    };
    let response = next.run(req).await;
    let outcome = response
        .extensions()
        .get::<Outcome>()
        .map(|o| o.0)
        .unwrap_or(if response.status().is_success() {
            "ok"
        } else {
            "error"
        });
    let m = &state.metrics;
    m.requests.with_label_values(&[method, outcome]).inc();
    m.latency
        .with_label_values(&[method])
        .observe(start.elapsed().as_secs_f64());
    response
}
