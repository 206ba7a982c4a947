//! Prometheus metrics, in a registry owned by [`crate::AppState`] (not a
//! global), so two gateways in one test process count separately.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
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
    connections: IntGauge,
    issuer_checks: IntCounterVec,
    issuer_latency: HistogramVec,
    in_flight_at_deadline: IntCounter,
}

/// Counts one open connection until dropped.
pub struct OpenConnection(IntGauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
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
        let connections = IntGauge::new(
            "gateway_open_connections",
            "HTTP connections being served (at most --max-connections).",
        )
        .expect("valid metric");
        let issuer_checks = IntCounterVec::new(
            Opts::new(
                "gateway_issuer_checks_total",
                "Tokens checked with their issuer, by issuer and result (current, not_current, unavailable).",
            ),
            &["issuer", "result"],
        )
        .expect("valid metric");
        let issuer_latency = HistogramVec::new(
            HistogramOpts::new(
                "gateway_issuer_check_duration_seconds",
                "Time to ask an issuer who holds a page's lock.",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0,
            ]),
            &["issuer"],
        )
        .expect("valid metric");
        let in_flight_at_deadline = IntCounter::new(
            "gateway_deadline_passed_in_flight_total",
            "Requests whose deadline passed after their statement was sent (then answered \
             with the statement's result if it finished within --outcome-wait, else \
             outcome_unknown).",
        )
        .expect("valid metric");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(latency.clone()),
            Box::new(connections.clone()),
            Box::new(issuer_checks.clone()),
            Box::new(issuer_latency.clone()),
            Box::new(in_flight_at_deadline.clone()),
        ] {
            registry.register(c).expect("register once");
        }
        Self {
            registry,
            requests,
            latency,
            connections,
            issuer_checks,
            issuer_latency,
            in_flight_at_deadline,
        }
    }

    /// A request's deadline passed while its statement was in flight.
    pub fn deadline_passed_in_flight(&self) {
        self.in_flight_at_deadline.inc();
    }

    /// How many times [`Metrics::deadline_passed_in_flight`] happened.
    pub fn deadlines_passed_in_flight(&self) -> u64 {
        self.in_flight_at_deadline.get()
    }

    /// Count a connection as open until the guard is dropped.
    pub fn connection_opened(&self) -> OpenConnection {
        self.connections.inc();
        OpenConnection(self.connections.clone())
    }

    /// Connections being served right now.
    pub fn open_connections(&self) -> i64 {
        self.connections.get()
    }

    /// One issuer check: `issuer` is a configured name (a bounded label set).
    pub fn issuer_check(&self, issuer: &str, result: &'static str, seconds: f64) {
        self.issuer_checks
            .with_label_values(&[issuer, result])
            .inc();
        self.issuer_latency
            .with_label_values(&[issuer])
            .observe(seconds);
    }

    /// The Prometheus text format: its content type, and the text.
    pub fn render(&self) -> Result<(String, Vec<u8>), prometheus::Error> {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        encoder.encode(&self.registry.gather(), &mut buf)?;
        Ok((encoder.format_type().to_string(), buf))
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
