//! Node names: a lock name as one path segment, and the node layout of the
//! queue (Curator's `_c_<guid>-<kind><seq>`).

use crate::LockError;

/// Curator's node name for `InterProcessMutex` (`_c_<guid>-lock-<seq>`).
pub(super) const FAIR_NODE: &str = "lock-";
/// A reader of the read-write lock (`_c_<guid>-read-<seq>`).
pub(super) const READ_NODE: &str = "read-";
/// A writer of the read-write lock (`_c_<guid>-write-<seq>`).
pub(super) const WRITE_NODE: &str = "write-";
/// The single node of the non-fair variant.
pub(super) const NON_FAIR_NODE: &str = "lock";
/// Longest lock name accepted (before escaping).
const MAX_NAME: usize = 200;

/// What a queue node asks for. The fair mutex and a writer both ask for the
/// lock alone, so they queue as the same thing: a mutex and the write half of
/// a read-write lock on one name exclude each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NodeKind {
    /// The fair mutex.
    Lock,
    Read,
    Write,
}

impl NodeKind {
    pub(super) fn infix(self) -> &'static str {
        match self {
            NodeKind::Lock => FAIR_NODE,
            NodeKind::Read => READ_NODE,
            NodeKind::Write => WRITE_NODE,
        }
    }

    /// Whether a node of this kind holds the lock alone.
    pub(super) fn is_exclusive(self) -> bool {
        !matches!(self, NodeKind::Read)
    }
}

/// What a child of a lock's parent is, by its name: a queue node of some
/// kind, or the non-fair node. Only a name: whether it counts (is it
/// ephemeral?) and where it stands (its czxid) the server says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Queued(NodeKind),
    NonFair,
}

impl Role {
    /// `_c_<guid>-<kind><seq>`, or the non-fair node; `None` for anything
    /// else (strangers' nodes).
    pub(super) fn of(name: &str) -> Option<Role> {
        if name == NON_FAIR_NODE {
            return Some(Role::NonFair);
        }
        queue_kind(name).map(Role::Queued)
    }

    /// Whether a node of this role holds the lock alone.
    pub(super) fn is_exclusive(self) -> bool {
        match self {
            Role::Queued(kind) => kind.is_exclusive(),
            Role::NonFair => true,
        }
    }
}

/// The kind of a queue node named `_c_<guid>-<kind><seq>` (Curator's
/// layout). The sequence only shapes the name: anyone may create a node so
/// named, so it orders nothing.
fn queue_kind(name: &str) -> Option<NodeKind> {
    if !name.starts_with("_c_") {
        return None;
    }
    // A GUID is hex digits and dashes, so none of the infixes can occur in it.
    [NodeKind::Lock, NodeKind::Read, NodeKind::Write]
        .into_iter()
        .find(|kind| {
            name.rsplit_once(kind.infix())
                .is_some_and(|(head, seq)| head.ends_with('-') && is_sequence(seq))
        })
}

/// The last path segment.
pub(super) fn node_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A sequence suffix: ten digits, or a negative number once the parent's
/// counter has wrapped.
fn is_sequence(seq: &str) -> bool {
    let digits = seq.strip_prefix('-').unwrap_or(seq);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
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
    fn children_are_named_as_queue_nodes_or_the_non_fair_node() {
        let guid = "0b5e7c1a-9f00-4e7e-8d0b-1c2d3e4f5a6b";
        for (suffix, kind) in [
            ("lock-0000000042", NodeKind::Lock),
            ("read-0000000007", NodeKind::Read),
            ("write-0000000008", NodeKind::Write),
            ("lock--2147483648", NodeKind::Lock),
        ] {
            let name = format!("_c_{guid}-{suffix}");
            assert_eq!(Role::of(&name), Some(Role::Queued(kind)), "{name}");
        }
        assert_eq!(Role::of(NON_FAIR_NODE), Some(Role::NonFair));
        assert_eq!(Role::of("_c_x-lock-"), None);
        assert_eq!(Role::of("other-lock-0000000001"), None);
        assert!(Role::NonFair.is_exclusive());
        assert!(!Role::Queued(NodeKind::Read).is_exclusive());
    }
}
