//! The queue as the server orders it. A name says what a node claims to be
//! ([`Role`]), but anyone with the create right picks any name; only the
//! server's own fields count: a lock node counts only while it is
//! ephemeral (a session that ends takes it along), and the nodes stand in
//! the order the server created them (their czxid), never in the order of
//! their names.
//!
//! Reading each child's stat is one request per child; they are all sent
//! before the first answer comes back (one session answers in order), so
//! a queue of any length costs one round trip.

use std::future::Future;

use zookeeper_client as zk;

use super::path::Role;
use super::session::retry;

/// A lock node that counts: ephemeral, named for a role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Counted {
    pub(super) name: String,
    pub(super) role: Role,
    /// Where the server created it: the queue's order, and its token.
    pub(super) czxid: i64,
}

/// Whether a node lives only as long as its session. ZooKeeper reports the
/// owner session of an ephemeral node and 0 for every other kind
/// (persistent, container, TTL), all of which would hold a lock forever.
pub(super) fn is_ephemeral(stat: &zk::Stat) -> bool {
    stat.ephemeral_owner != 0
}

/// `op` on each of `paths`, all sent before the first answer (one round
/// trip); the answers in the same order. Sent again, all of them, after a
/// connection loss.
pub(super) async fn on_each<T, F, Fut>(
    paths: &[String],
    op: F,
) -> Result<Vec<Result<T, zk::Error>>, zk::Error>
where
    F: Fn(&str) -> Fut,
    Fut: Future<Output = Result<T, zk::Error>>,
{
    retry(|| async {
        let answers = futures::future::join_all(paths.iter().map(|p| op(p))).await;
        if answers
            .iter()
            .any(|a| matches!(a, Err(zk::Error::ConnectionLoss)))
        {
            return Err(zk::Error::ConnectionLoss);
        }
        Ok(answers)
    })
    .await
}

/// The children of `parent` named for a role (but `skip`), with their
/// paths.
pub(super) fn named<'a>(
    parent: &str,
    children: &'a [String],
    skip: &str,
) -> (Vec<(&'a str, Role)>, Vec<String>) {
    let named: Vec<(&str, Role)> = children
        .iter()
        .filter(|c| *c != skip)
        .filter_map(|c| Role::of(c).map(|role| (c.as_str(), role)))
        .collect();
    let paths = named.iter().map(|(n, _)| format!("{parent}/{n}")).collect();
    (named, paths)
}

/// The nodes among `children` of `parent` (but `skip`) that count, in the
/// order the server created them. An `exists` each, which needs no read
/// right on the node. Nodes gone since the listing are left out.
pub(super) async fn counted(
    client: &zk::Client,
    parent: &str,
    children: &[String],
    skip: &str,
) -> Result<Vec<Counted>, zk::Error> {
    let (named, paths) = named(parent, children, skip);
    if named.is_empty() {
        return Ok(Vec::new());
    }
    let stats = on_each(&paths, |p| client.check_stat(p)).await?;
    let mut queue = Vec::with_capacity(named.len());
    for ((name, role), stat) in named.into_iter().zip(stats) {
        match stat {
            Ok(Some(stat)) if is_ephemeral(&stat) => queue.push(Counted {
                name: name.to_string(),
                role,
                czxid: stat.czxid,
            }),
            Ok(_) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(e),
        }
    }
    queue.sort_unstable_by_key(|n| n.czxid);
    Ok(queue)
}
