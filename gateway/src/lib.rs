//! Fenced page storage.
