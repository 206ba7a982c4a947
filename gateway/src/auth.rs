//! Who may write: API keys, kept only as SHA-256 digests and compared in
//! constant time, and the `Authorization: Bearer <key>` check.
//!
//! Two key rings: writers (`--api-keys`, `--api-keys-file`), whose client name
//! becomes the history's `client_id`, and admins (`--admin-keys`,
//! `--admin-keys-file`), who may only call the admin endpoint. A key belongs
//! to one ring and one name.

use std::fmt;
use std::path::Path;

use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// Shortest accepted key, in bytes.
pub const MIN_KEY_LEN: usize = 16;

/// Whether writes need a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// A PUT, and any request carrying `Fencing-Token`, needs
    /// `Authorization: Bearer <key>`; the key's client is the writer.
    Required,
    /// Anybody may write, under any `Client-Id` (a loud WARN at start).
    Off,
}

/// Keys by name, as SHA-256 digests. `Debug` shows the names only.
#[derive(Clone, Default)]
pub struct KeyRing {
    entries: Vec<([u8; 32], String)>,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(_, n)| n))
            .finish()
    }
}

fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

impl KeyRing {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The names, in the order they were added.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(_, n)| n.as_str())
    }

    /// Add `name`'s `key`. `origin` names where it came from (a flag's entry,
    /// a file's line) for the error, which never contains the key. Refused: a
    /// name that is not 1 to 128 visible ASCII characters, a key shorter than
    /// [`MIN_KEY_LEN`] bytes or with other than visible ASCII in it, a name
    /// given twice with different keys, one key given to two names.
    pub fn add(&mut self, origin: &str, name: &str, key: &str) -> Result<(), String> {
        if name.is_empty() {
            return Err(format!("{origin}: the client name before '=' is empty"));
        }
        if fencelock::validate_client_id(name).is_err() {
            return Err(format!(
                "{origin}: client name {name:?} must be 1 to 128 visible ASCII characters"
            ));
        }
        if key.is_empty() {
            return Err(format!("{origin}: the key of {name:?} is empty"));
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "{origin}: the key of {name:?} has characters other than visible ASCII \
                 (it travels in an HTTP header)"
            ));
        }
        if key.len() < MIN_KEY_LEN {
            return Err(format!(
                "{origin}: the key of {name:?} is shorter than {MIN_KEY_LEN} bytes"
            ));
        }
        let d = digest(key.as_bytes());
        for (other, other_name) in &self.entries {
            let same_key = bool::from(other.ct_eq(&d));
            match (other_name == name, same_key) {
                (true, true) => return Ok(()),
                (true, false) => {
                    return Err(format!(
                        "{origin}: client {name:?} is given twice, with different keys"
                    ))
                }
                (false, true) => {
                    return Err(format!(
                        "{origin}: the key of {name:?} is also the key of {other_name:?}; \
                         each client needs its own key"
                    ))
                }
                (false, false) => {}
            }
        }
        self.entries.push((d, name.to_owned()));
        Ok(())
    }

    /// One `name=key` entry (surrounding spaces ignored).
    fn add_entry(&mut self, origin: &str, entry: &str) -> Result<(), String> {
        let Some((name, key)) = entry.split_once('=') else {
            return Err(format!("{origin}: expected client=key, found no '='"));
        };
        self.add(origin, name.trim(), key.trim())
    }

    /// `client=key,client=key` (empty entries ignored), from `source` (a flag
    /// or variable name, for errors).
    pub fn add_list(&mut self, source: &str, list: &str) -> Result<(), String> {
        for (i, entry) in list.split(',').enumerate() {
            if entry.trim().is_empty() {
                continue;
            }
            self.add_entry(&format!("{source} entry {}", i + 1), entry)?;
        }
        Ok(())
    }

    /// A file of `client=key` lines; `#` starts a comment line, blank lines
    /// are ignored.
    pub fn add_file(&mut self, path: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read key file {}: {e}", path.display()))?;
        self.add_text(&path.display().to_string(), &text)
    }

    /// The lines of a key file, `origin` naming it.
    pub fn add_text(&mut self, origin: &str, text: &str) -> Result<(), String> {
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            self.add_entry(&format!("{origin} line {}", i + 1), line)?;
        }
        Ok(())
    }

    /// The name whose key this is. Every entry is compared, each in constant
    /// time, so the time taken says nothing about how close a guess was.
    pub fn find(&self, key: &str) -> Option<&str> {
        let d = digest(key.as_bytes());
        let mut found = None;
        for (other, name) in &self.entries {
            if bool::from(other.ct_eq(&d)) {
                found = Some(name.as_str());
            }
        }
        found
    }

    /// Whether a key is in both rings (refused: an admin key is not a writer key).
    pub fn shared_name<'a>(&'a self, other: &'a KeyRing) -> Option<(&'a str, &'a str)> {
        self.entries.iter().find_map(|(d, name)| {
            other
                .entries
                .iter()
                .find(|(o, _)| bool::from(o.ct_eq(d)))
                .map(|(_, o)| (name.as_str(), o.as_str()))
        })
    }
}

/// The key of `Authorization: Bearer <key>`: `Ok(None)` when the header is
/// missing, `Err` when it is malformed.
pub fn bearer(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::unauthorized(
            "send the Authorization header at most once",
        ));
    }
    let malformed = || ApiError::unauthorized("expected Authorization: Bearer <key>");
    let value = value.to_str().map_err(|_| malformed())?;
    let (scheme, key) = value.trim().split_once(' ').ok_or_else(malformed)?;
    let key = key.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || key.is_empty() {
        return Err(malformed());
    }
    Ok(Some(key))
}

/// The writer a request's key names (401 when it names none).
pub fn authenticate<'k>(ring: &'k KeyRing, headers: &HeaderMap) -> Result<&'k str, ApiError> {
    let key = bearer(headers)?.ok_or_else(|| {
        ApiError::unauthorized(
            "this gateway requires an API key for writes and fenced requests: \
             send Authorization: Bearer <key>",
        )
    })?;
    ring.find(key)
        .ok_or_else(|| ApiError::unauthorized("unknown API key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "key-number-one-0000";
    const K2: &str = "key-number-two-0000";

    #[test]
    fn keys_are_found_by_value_and_never_shown() {
        let mut ring = KeyRing::new();
        ring.add_list("GATEWAY_API_KEYS", &format!("alice={K1}, bob={K2},"))
            .unwrap();
        assert_eq!(ring.find(K1), Some("alice"));
        assert_eq!(ring.find(K2), Some("bob"));
        assert_eq!(ring.find("key-number-three-00"), None);
        let shown = format!("{ring:?}");
        assert!(!shown.contains(K1) && shown.contains("alice"), "{shown}");
    }

    #[test]
    fn bad_entries_name_their_line_but_not_the_key() {
        let cases = [
            ("alice=short", "f line 2: the key of \"alice\" is shorter than 16 bytes"),
            ("alice=", "f line 2: the key of \"alice\" is empty"),
            ("=some-long-key-0000", "f line 2: the client name before '=' is empty"),
            ("no equals sign here", "f line 2: expected client=key, found no '='"),
            (
                "alice=other-long-key-0000",
                "f line 2: client \"alice\" is given twice, with different keys",
            ),
            (
                &format!("carol={K1}"),
                "f line 2: the key of \"carol\" is also the key of \"alice\"; each client needs its own key",
            ),
        ];
        for (line, expected) in cases {
            let mut ring = KeyRing::new();
            let err = ring
                .add_text("f", &format!("alice={K1}\n{line}\n"))
                .unwrap_err();
            assert_eq!(err, expected);
            assert!(!err.contains(K1), "{err}");
        }
        // The same client with the same key twice is fine.
        let mut ring = KeyRing::new();
        ring.add_text("f", &format!("alice={K1}\nalice = {K1}\n# x\n"))
            .unwrap();
        assert_eq!(ring.len(), 1);
    }

    #[test]
    fn bearer_header_forms() {
        let mut h = HeaderMap::new();
        assert!(bearer(&h).unwrap().is_none());
        h.insert(AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h).unwrap(), Some("abc"));
        h.insert(AUTHORIZATION, "bearer   abc ".parse().unwrap());
        assert_eq!(bearer(&h).unwrap(), Some("abc"));
        for bad in ["Basic abc", "Bearer", "Bearer ", "abc"] {
            h.insert(AUTHORIZATION, bad.parse().unwrap());
            assert!(bearer(&h).is_err(), "{bad}");
        }
    }
}
