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

/// One node of the queue, parsed from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct QueueNode<'a> {
    pub(super) name: &'a str,
    pub(super) seq: i64,
    pub(super) kind: NodeKind,
}

/// `_c_<guid>-<kind><seq>`, or `None` for anything else (the non-fair node,
/// strangers' nodes).
pub(super) fn queue_node(name: &str) -> Option<QueueNode<'_>> {
    if !name.starts_with("_c_") {
        return None;
    }
    // A GUID is hex digits and dashes, so none of the infixes can occur in it.
    [NodeKind::Lock, NodeKind::Read, NodeKind::Write]
        .into_iter()
        .find_map(|kind| {
            let (head, seq) = name.rsplit_once(kind.infix())?;
            if !head.ends_with('-') || !is_sequence(seq) {
                return None;
            }
            Some(QueueNode {
                name,
                seq: seq.parse().ok()?,
                kind,
            })
        })
}

/// The queue under a lock's parent, in sequence order (the order ZooKeeper
/// created the nodes in).
pub(super) fn queue_of<S: AsRef<str>>(children: &[S]) -> Vec<QueueNode<'_>> {
    let mut queue: Vec<QueueNode<'_>> = children
        .iter()
        .filter_map(|c| queue_node(c.as_ref()))
        .collect();
    queue.sort_unstable_by_key(|n| (n.seq, n.name));
    queue
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
    fn queue_nodes_are_parsed_from_curator_style_names() {
        let guid = "0b5e7c1a-9f00-4e7e-8d0b-1c2d3e4f5a6b";
        let lock = format!("_c_{guid}-lock-0000000042");
        assert_eq!(
            queue_node(&lock),
            Some(QueueNode {
                name: &lock,
                seq: 42,
                kind: NodeKind::Lock
            })
        );
        let read = format!("_c_{guid}-read-0000000007");
        assert_eq!(
            queue_node(&read).map(|n| (n.seq, n.kind)),
            Some((7, NodeKind::Read))
        );
        let write = format!("_c_{guid}-write-0000000008");
        assert_eq!(
            queue_node(&write).map(|n| (n.seq, n.kind)),
            Some((8, NodeKind::Write))
        );
        let wrapped = format!("_c_{guid}-lock--2147483648");
        assert_eq!(queue_node(&wrapped).map(|n| n.seq), Some(-2_147_483_648));
        assert_eq!(queue_node("_c_x-lock-"), None);
        assert_eq!(queue_node(NON_FAIR_NODE), None);
        assert_eq!(queue_node("other-lock-0000000001"), None);
    }

    #[test]
    fn the_queue_is_in_sequence_order() {
        let children = [
            "_c_b-read-0000000003",
            "lock",
            "_c_a-lock-0000000001",
            "_c_c-write-0000000002",
        ];
        let order: Vec<&str> = queue_of(&children).iter().map(|n| n.name).collect();
        assert_eq!(
            order,
            [
                "_c_a-lock-0000000001",
                "_c_c-write-0000000002",
                "_c_b-read-0000000003"
            ]
        );
    }
}
