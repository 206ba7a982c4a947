//! Each writer's rate: a token bucket per client (governor's GCRA), for
//! the requests that reach a page's fence (a PUT, a fenced GET). Off unless
//! `--write-rate-per-key` is set. Beyond it: 429 `rate_limited` with
//! `Retry-After`, the seconds until the next request would be let through;
//! nothing is written, and the worker waits that long before it retries.
//!
//! The bucket is the client's: the key's, as authentication names it (with
//! authentication off, whatever `Client-Id` says, so only a hint).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::error::ApiError;

/// Buckets kept before the idle ones are dropped (clients are keys: few).
const KEEP: usize = 10_000;

/// The writers' buckets, or none (no limit).
#[derive(Clone, Default)]
pub struct WriteRate {
    limiter: Option<Arc<DefaultKeyedRateLimiter<String>>>,
    per_second: u32,
}

impl std::fmt::Debug for WriteRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteRate")
            .field("per_second", &self.per_second)
            .finish()
    }
}

impl WriteRate {
    /// `per_second` requests a second per client, in bursts of up to
    /// `burst`; `per_second` 0 is no limit.
    pub fn new(per_second: u32, burst: u32) -> Self {
        let Some(rate) = NonZeroU32::new(per_second) else {
            return Self::default();
        };
        let burst = NonZeroU32::new(burst).unwrap_or(rate);
        Self {
            limiter: Some(Arc::new(RateLimiter::keyed(
                Quota::per_second(rate).allow_burst(burst),
            ))),
            per_second,
        }
    }

    /// One request of `client`, or 429 `rate_limited` with the wait.
    pub fn check(&self, client: &str) -> Result<(), ApiError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        if limiter.len() > KEEP {
            limiter.retain_recent();
        }
        limiter.check_key(&client.to_owned()).map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            ApiError::RateLimited {
                per_second: self.per_second,
                retry_after: wait.max(Duration::from_millis(1)),
            }
        })
    }
}
