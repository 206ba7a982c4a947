//! The token checked with the lock service that issued it, before the
//! fenced statement: the storage's half of Chubby's `CheckSequencer`; and,
//! where the lock service cannot stop its clients from writing its keys
//! (Redis), against what a honest holder's token can be.

use fencelock::{LockState, Token};

use crate::error::ApiError;
use crate::issuers::lock_name;
use crate::store::{self, Fence};
use crate::{AppState, FenceCheck};

use super::FencingHeaders;

/// Chubby's `CheckSequencer`: before the fenced statement, ask the token's
/// issuer whether lock `page:<id>` is held right now by this client with
/// exactly this token. Runs only when fencing is enforced and issuers are
/// configured. Refuses a token nobody was granted (guessed, from the future),
/// one granted to another client (copied), and one whose lease has ended.
///
/// The check and the write are NOT atomic: the lease can end, and another
/// client be granted the lock, between the issuer's answer and the fenced
/// statement. That is safe because the statement still checks the token
/// against the page's fence under the page's row lock: the newer holder's
/// token is higher, and once any access with it has reached the page, this
/// token is refused as `stale_token`; before that, this write is simply
/// ordered before the newer holder's, which reads it. That is the case the
/// fence has always handled. What the issuer adds is what the fence cannot
/// know: that the token was granted at all, and to this client, so the fence
/// only ever moves to tokens the issuer really granted and never passes its
/// counter.
///
/// That holds while only the issuer writes its own records. A Redis lock
/// client may write the lock's keys by hand (a script runs with its
/// caller's rights), so for such issuers a holder the issuer names is still
/// refused as `suspected_forgery` (see [`suspected_forgery`]).
pub(super) async fn check_with_issuer(
    state: &AppState,
    id: &str,
    method: &'static str,
    h: &FencingHeaders,
) -> Result<(), ApiError> {
    let issuers = &state.trust.issuers;
    let Some(token) = h.token else {
        return Ok(());
    };
    if state.fencing != FenceCheck::Enforce || issuers.is_empty() {
        return Ok(());
    }
    let Some(issuer) = issuers.get(&h.issuer) else {
        return Err(ApiError::UnknownIssuer {
            issuer: h.issuer.clone(),
            known: issuers.names(),
        });
    };
    let lock = lock_name(id);
    let max_jump = issuers
        .max_token_jump()
        .filter(|_| issuer.spec().bounds_jumps());
    let started = std::time::Instant::now();
    // The page's fence, where a jump is bounded, is read beside the
    // issuer's answer: no time added to the check.
    let (answer, fence) = tokio::join!(issuer.state(&lock, issuers.timeout()), async {
        match max_jump {
            Some(_) => store::fence(&state.db, id).await.map(Some),
            None => Ok(None),
        }
    });
    let seconds = started.elapsed().as_secs_f64();
    let LockState { holder, minted } = match answer {
        Ok(answer) => answer,
        Err(e) => {
            state
                .metrics
                .issuer_check(&h.issuer, "unavailable", seconds);
            return Err(ApiError::IssuerUnavailable {
                issuer: h.issuer.clone(),
                detail: e.to_string(),
            });
        }
    };
    // With authentication required `client_id` is the key's client; with it
    // off, the `Client-Id` sent, if any.
    let same_client = |holder: &str| h.client_id.as_deref().is_none_or(|c| c == holder);
    let (outcome, refusal) = match &holder {
        Some(x) if x.token == token && same_client(&x.client_id) => {
            let fence = fence?.flatten();
            match suspected_forgery(token, &h.issuer, minted, fence.as_ref(), max_jump) {
                None => {
                    state.metrics.issuer_check(&h.issuer, "current", seconds);
                    return Ok(());
                }
                Some(forgery) => ("suspected_forgery", forgery),
            }
        }
        other => {
            let message = match other {
                Some(x) if x.token == token => format!(
                    "lock {lock:?} is held with token {token} by another client: a token is \
                     only good for the client it was granted to"
                ),
                Some(x) => format!(
                    "issuer {:?} says lock {lock:?} is held with token {}, not {token}",
                    h.issuer, x.token
                ),
                None => format!(
                    "issuer {:?} says nobody holds lock {lock:?} right now, so token {token} is \
                     not current (expired, released, or never granted)",
                    h.issuer
                ),
            };
            let refusal = ApiError::TokenNotCurrent {
                issuer: h.issuer.clone(),
                offered: token,
                holder: holder.as_ref().map(|x| x.token),
                message,
            };
            ("token_not_current", refusal)
        }
    };
    state.metrics.issuer_check(&h.issuer, outcome, seconds);
    store::record_refusal(
        &state.db,
        id,
        method,
        outcome,
        token,
        &h.issuer,
        h.client_id.as_deref(),
    )
    .await?;
    if outcome == "suspected_forgery" {
        tracing::warn!(page = %id, issuer = %h.issuer, offered = %token, minted = ?minted, client = ?h.client_id, "suspected forgery: {refusal}");
    } else {
        tracing::info!(page = %id, issuer = %h.issuer, offered = %token, holder = ?holder, "token not current");
    }
    Err(refusal)
}

/// Why `token`, which issuer `issuer` names as its client's current one,
/// cannot have been minted in turn; `None` when nothing says so.
///
/// - Above `minted`, the highest token the issuer says it minted for the
///   lock (read in the same answer as the holder): the holder's record was
///   written by hand.
/// - More than `max_jump` above the page's fence (of this issuer; no fence
///   counts as 0): a counter counts the grants of one lock, and a fence
///   that far behind is not one honest writers left behind. A client that
///   also raised the counter by hand gets past the first check, not this
///   one: each such write can move the fence by `max_jump` at most, never
///   to 2^63-1 at once. An admin accepts a real jump by setting the fence.
fn suspected_forgery(
    token: Token,
    issuer: &str,
    minted: Option<Token>,
    fence: Option<&Fence>,
    max_jump: Option<u64>,
) -> Option<ApiError> {
    let current = match fence {
        Some(f) if f.issuer == issuer => Some(f.token),
        // Another issuer's fence: the fenced statement refuses the mix.
        Some(_) => return None,
        None => None,
    };
    let message = if let Some(m) = minted.filter(|m| token > *m) {
        format!(
            "issuer {issuer:?} names token {token} as current, but the highest token it has \
             minted for this lock is {m}: its lock record was written by hand. Nothing written"
        )
    } else {
        let max = max_jump?;
        let base = current.unwrap_or(Token::MIN);
        let jump = token.get().saturating_sub(base.get());
        if jump <= max {
            return None;
        }
        format!(
            "token {token} is {jump} above the page's fence {base}, more than the {max} grants \
             this gateway accepts (GATEWAY_MAX_TOKEN_JUMP): the lock's counter was likely \
             written by hand. Nothing written; an admin can accept the jump by setting the \
             page's fence"
        )
    };
    Some(ApiError::SuspectedForgery {
        issuer: issuer.to_owned(),
        offered: token,
        minted,
        current,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> Token {
        Token::new(n).unwrap()
    }

    fn fence(issuer: &str, n: u64) -> Fence {
        Fence {
            issuer: issuer.into(),
            token: t(n),
        }
    }

    #[test]
    fn a_token_above_the_counter_or_too_far_above_the_fence_is_suspected() {
        let bound = Some(1 << 20);
        let redis = fence("redis", 10);
        let suspected = |token, minted, fence, bound| {
            suspected_forgery(t(token), "redis", minted, fence, bound).map(|e| e.code().to_owned())
        };
        // The honest ones: at or below the counter, within the bound.
        assert_eq!(suspected(11, Some(t(11)), Some(&redis), bound), None);
        assert_eq!(suspected(10 + (1 << 20), None, Some(&redis), bound), None);
        assert_eq!(suspected(1 << 20, None, None, bound), None);
        // Above what the issuer minted, bound or no bound.
        for bound in [bound, None] {
            assert_eq!(
                suspected(12, Some(t(11)), Some(&redis), bound).as_deref(),
                Some("suspected_forgery")
            );
        }
        // Too far above the fence (or above nothing).
        let max = i64::MAX as u64;
        for (token, fence) in [
            (11 + (1 << 20), Some(&redis)),
            (max, Some(&redis)),
            (max, None),
        ] {
            assert_eq!(
                suspected(token, Some(t(max)), fence, bound).as_deref(),
                Some("suspected_forgery"),
                "{token}"
            );
            assert_eq!(suspected(token, None, fence, None), None, "no bound");
        }
        // Another issuer's fence is the fenced statement's to refuse.
        let zk = fence("zookeeper", 1);
        assert_eq!(suspected(max, None, Some(&zk), bound), None);
    }
}
