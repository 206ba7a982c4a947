use std::time::Duration;

/// Everything a lock backend can answer instead of a lease.
///
/// Comparable with `==` so tests can assert the exact error. Messages from
/// drivers are kept as strings for that reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The request itself is wrong (empty name, zero TTL, bad URL). Never retried.
    #[error("invalid lock configuration: {0}")]
    InvalidConfig(String),

    /// The lock service could not be reached or did not answer in time. Retryable.
    #[error("lock service {service} unavailable: {detail}")]
    Unavailable { service: String, detail: String },

    /// Somebody else held the lock for the whole wait.
    #[error("lock {name:?} still held by another client after waiting {waited:?}")]
    Timeout { name: String, waited: Duration },

    /// The grant is gone: expired, taken over, or refused on renewal.
    #[error("lock {name:?} is no longer held by this client: {reason}")]
    NotHeld { name: String, reason: String },

    /// The service answered something the backend does not understand.
    #[error("lock service {service} protocol error: {detail}")]
    Protocol { service: String, detail: String },
}

impl LockError {
    /// Whether trying again later can help.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LockError::Unavailable { .. } | LockError::Timeout { .. }
        )
    }

    pub fn unavailable(service: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        LockError::Unavailable {
            service: service.into(),
            detail: detail.to_string(),
        }
    }

    pub fn protocol(service: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        LockError::Protocol {
            service: service.into(),
            detail: detail.to_string(),
        }
    }
}
