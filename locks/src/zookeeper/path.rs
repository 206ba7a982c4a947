//! Node names: a lock name as one path segment, and Curator's node layout.

use crate::LockError;

/// Curator's node name for `InterProcessMutex` (`_c_<guid>-lock-<seq>`).
pub(super) const FAIR_NODE: &str = "lock-";
/// The single node of the non-fair variant.
pub(super) const NON_FAIR_NODE: &str = "lock";
/// Longest lock name accepted (before escaping).
const MAX_NAME: usize = 200;

/// The last path segment.
pub(super) fn node_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The sequence suffix of a fair lock node (`...-lock-0000000042`).
pub(super) fn sequence_of(node: &str) -> Option<i64> {
    let (_, seq) = node.rsplit_once(FAIR_NODE)?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return None;
    }
    seq.parse().ok()
}

/// A lock name as one ZooKeeper path segment: `[A-Za-z0-9_-]` kept, every
/// other byte written `%XX`. Injective, so two names never share a node, and
/// never `.`/`..` or a `/`.
pub fn escape_name(name: &str) -> Result<String, LockError> {
    if name.is_empty() {
        return Err(LockError::InvalidConfig("lock name is empty".into()));
    }
    if name.len() > MAX_NAME {
        return Err(LockError::InvalidConfig(format!(
            "lock name is {} bytes; at most {MAX_NAME}",
            name.len()
        )));
    }
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_one_safe_segment() {
        assert_eq!(escape_name("page-1").unwrap(), "page-1");
        assert_eq!(escape_name("a/b").unwrap(), "a%2Fb");
        assert_eq!(escape_name("..").unwrap(), "%2E%2E");
        assert_eq!(escape_name("%2F").unwrap(), "%252F");
        assert_eq!(escape_name("é").unwrap(), "%C3%A9");
        assert!(matches!(escape_name(""), Err(LockError::InvalidConfig(_))));
        assert!(matches!(
            escape_name(&"x".repeat(201)),
            Err(LockError::InvalidConfig(_))
        ));
    }

    #[test]
    fn sequence_suffix_is_parsed_from_curator_names() {
        assert_eq!(sequence_of("_c_0b5e-lock-0000000042"), Some(42));
        assert_eq!(sequence_of("_c_x-lock-"), None);
        assert_eq!(sequence_of("other"), None);
    }
}
