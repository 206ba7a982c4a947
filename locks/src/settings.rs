//! What every backend's builder sets, written once: the client id its
//! grants record, fair or not, and how long a waiter of a notified lock
//! waits for a wake-up before it tries again. A backend embeds one
//! [`Settings`], implements [`Configurable`], and its public builder methods
//! (`with_client_id`, `fair`, `non_fair`, `is_fair`, `with_poll_fallback`)
//! are one line each over the provided methods here.

// Only Redis and the lease tables wait for wake-ups (and so read the fallback).
#![cfg_attr(
    not(any(feature = "redis", feature = "lease-postgres", feature = "lease-mysql")),
    allow(dead_code)
)]

use std::sync::Arc;
use std::time::Duration;

use crate::{default_client_id, validate_client_id, LockError};

/// The longest a waiter waits for a wake-up (a release message, a
/// notification, the bell) before it tries again anyway, unless the
/// backend's `with_poll_fallback` says otherwise.
pub const DEFAULT_POLL_FALLBACK: Duration = Duration::from_millis(500);

/// A fair waiter's place lasts this many fallback polls without a renewal.
const PLACE_POLLS: u32 = 4;

/// The settings a backend's builder methods change; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    client_id: Arc<str>,
    fair: bool,
    poll_fallback: Duration,
}

impl Default for Settings {
    /// `<hostname>-<pid>`, fair, the default fallback poll.
    fn default() -> Self {
        Settings {
            client_id: default_client_id().into(),
            fair: true,
            poll_fallback: DEFAULT_POLL_FALLBACK,
        }
    }
}

impl Settings {
    /// The id every grant records ([`LockService::client_id`](crate::LockService::client_id)).
    pub(crate) fn client_id(&self) -> &str {
        &self.client_id
    }

    pub(crate) fn is_fair(&self) -> bool {
        self.fair
    }

    pub(crate) fn poll_fallback(&self) -> Duration {
        self.poll_fallback
    }

    /// How long a fair waiter's place lasts without a renewal: four
    /// fallback polls, so that a live waiter renews it well in time.
    pub(crate) fn place(&self) -> Duration {
        self.poll_fallback * PLACE_POLLS
    }
}

/// A backend with [`Settings`]: the builder logic, once for all of them.
pub(crate) trait Configurable: Sized {
    fn settings_mut(&mut self) -> &mut Settings;

    /// `InvalidConfig` unless `id` is 1 to 128 visible ASCII characters.
    fn set_client_id(mut self, id: impl Into<String>) -> Result<Self, LockError> {
        let id = id.into();
        validate_client_id(&id)?;
        self.settings_mut().client_id = id.into();
        Ok(self)
    }

    fn set_fair(mut self, fair: bool) -> Self {
        self.settings_mut().fair = fair;
        self
    }

    /// At least 1 ms: a zero bound would make waiters spin.
    fn set_poll_fallback(mut self, fallback: Duration) -> Self {
        self.settings_mut().poll_fallback = fallback.max(Duration::from_millis(1));
        self
    }
}
