//! Reading a lock from outside: who holds it exclusively ([`holder`], what a
//! storage asks before a fenced write), and a bound on every token it has
//! granted ([`minted`]).

use zookeeper_client as zk;

use super::path::Role;
use super::queue::{counted, is_ephemeral, named, on_each};
use super::session::{retry, zk_error};
use crate::LockError;

/// What ZooKeeper says about one lock.
pub(super) struct Seen {
    /// Who holds it exclusively: the client id in its node's data, and the
    /// node's czxid (its token).
    pub(super) holder: Option<(String, i64)>,
    /// At least every token granted for it so far (see [`minted`]).
    pub(super) minted: Option<i64>,
}

/// Who holds the lock under `parent` exclusively, as ZooKeeper sees it
/// now, and (`with_minted`) a bound on its tokens. The holder is the
/// counted node created first ([`super::queue`]): the head of the queue
/// when that is a mutex or a writer, or the non-fair node; both can be
/// there for a moment when the two variants are mixed on one name and one
/// of them is backing out, and then the older one holds (the younger saw it
/// and refuses). Nobody while a reader heads the queue: readers share the
/// lock, and no one of them is *the* holder.
///
/// A node's data is trusted only as its creator wrote it: the recipes never
/// write a lock node after creating it, so a head whose data changed since
/// (version ≠ 0) names nobody, whoever rewrote it.
///
/// The `sync` is pipelined with the listing: ZooKeeper answers a session's
/// requests in order and a read after a `sync` reflects every write the
/// leader had committed when the sync reached it, so a session on a lagging
/// follower does not miss a grant that another client was just answered.
/// Then every node's data and stat are read at once: two round trips, as
/// many as reading the head alone.
pub(super) async fn holder(
    client: &zk::Client,
    root: &str,
    parent: &str,
    with_minted: bool,
) -> Result<Seen, LockError> {
    let (synced, listed) = tokio::join!(client.sync(parent), client.get_children(parent));
    let listed = match synced.and(listed) {
        Err(zk::Error::ConnectionLoss) => retry(|| client.get_children(parent)).await,
        other => other,
    };
    let (children, parent_stat) = match listed {
        Ok(listed) => listed,
        Err(zk::Error::NoNode) => {
            let minted = match with_minted {
                true => root_bound(client, root).await?,
                false => None,
            };
            return Ok(Seen {
                holder: None,
                minted,
            });
        }
        Err(e) => return Err(zk_error(e)),
    };
    Ok(Seen {
        holder: head(client, parent, &children).await?,
        // The parent's last child change: every node it ever held, and so
        // every token of this lock, is at or below it (a token of an
        // earlier parent under this name is below this parent's czxid).
        minted: Some(parent_stat.pzxid),
    })
}

/// A counted node as the lookup read it.
struct Read<'a> {
    name: &'a str,
    role: Role,
    czxid: i64,
    /// Its data and data version; `None` when this session may not read it.
    data: Option<(Vec<u8>, i32)>,
}

/// The first counted node among `children` and its data, if it holds
/// alone.
async fn head(
    client: &zk::Client,
    parent: &str,
    children: &[String],
) -> Result<Option<(String, i64)>, LockError> {
    let (named, paths) = named(parent, children, "");
    let reads = on_each(&paths, |p| client.get_data(p))
        .await
        .map_err(zk_error)?;
    let mut nodes = Vec::with_capacity(named.len());
    let mut unreadable = Vec::new();
    for ((name, role), read) in named.into_iter().zip(reads) {
        match read {
            Ok((data, stat)) if is_ephemeral(&stat) => nodes.push(Read {
                name,
                role,
                czxid: stat.czxid,
                data: Some((data, stat.version)),
            }),
            Ok(_) | Err(zk::Error::NoNode) => {}
            // A node whose creator did not let us read it: where it stands
            // is still ours to know (`exists` needs no right).
            Err(zk::Error::NoAuth) => unreadable.push(name.to_string()),
            Err(e) => return Err(zk_error(e)),
        }
    }
    let hidden = counted(client, parent, &unreadable, "")
        .await
        .map_err(zk_error)?;
    nodes.extend(hidden.iter().map(|n| Read {
        name: &n.name,
        role: n.role,
        czxid: n.czxid,
        data: None,
    }));
    let Some(Read {
        name,
        role,
        czxid,
        data,
    }) = nodes.into_iter().min_by_key(|n| n.czxid)
    else {
        return Ok(None);
    };
    if !role.is_exclusive() {
        return Ok(None);
    }
    match data {
        None => Err(LockError::InvalidConfig(format!(
            "zookeeper lock node {parent}/{name} holds the lock, but this session may not \
             read it (NoAuth): the lock clients must name this reader in their ACLs \
             (fencelock::zookeeper::Roles::reader)"
        ))),
        Some((_, version)) if version != 0 => {
            tracing::warn!(node = %format!("{parent}/{name}"), version, "the holder's data was rewritten after its create: it names nobody");
            Ok(None)
        }
        Some((data, _)) => {
            let text = String::from_utf8_lossy(&data);
            // Node data is "<guid>\n<id>".
            let id = text.split_once('\n').map_or(&*text, |(_, c)| c).to_string();
            Ok(Some((id, czxid)))
        }
    }
}

/// At least every token granted for the lock under `parent` in `root`, in
/// one round trip: the largest `pzxid` (the zxid of the last change to a
/// node's children) of the parent and the root. The parent's is at or
/// above every lock node it held; once an idle parent is gone, the root's
/// is at or above its deletion. Every later grant is created after the
/// answer, so its token is higher: a fence set at most this high never
/// refuses an honest holder. `None` when neither exists.
pub(super) async fn minted(
    client: &zk::Client,
    root: &str,
    parent: &str,
) -> Result<Option<i64>, LockError> {
    let read = retry(|| async {
        let (synced, parent, root) = tokio::join!(
            client.sync(parent),
            client.check_stat(parent),
            client.check_stat(root)
        );
        match synced {
            Ok(()) | Err(zk::Error::NoNode) => Ok((parent?, root?)),
            Err(e) => Err(e),
        }
    })
    .await
    .map_err(zk_error)?;
    Ok(match read {
        (Some(p), Some(r)) => Some(p.pzxid.max(r.pzxid)),
        (Some(s), None) | (None, Some(s)) => Some(s.pzxid),
        (None, None) => None,
    })
}

/// The root's `pzxid`, for a lock whose parent is gone.
async fn root_bound(client: &zk::Client, root: &str) -> Result<Option<i64>, LockError> {
    let stat = retry(|| client.check_stat(root)).await.map_err(zk_error)?;
    Ok(stat.map(|s| s.pzxid))
}
