//! The token checked with the lock service that issued it, before the
//! fenced statement: the storage's half of Chubby's `CheckSequencer`.

use crate::error::ApiError;
use crate::issuers::lock_name;
use crate::store;
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
    let started = std::time::Instant::now();
    let answer = issuer.current_holder(&lock, issuers.timeout()).await;
    let seconds = started.elapsed().as_secs_f64();
    let holder = match answer {
        Ok(holder) => holder,
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
    let message = match &holder {
        Some(x) if x.token == token && same_client(&x.client_id) => {
            state.metrics.issuer_check(&h.issuer, "current", seconds);
            return Ok(());
        }
        Some(x) if x.token == token => format!(
            "lock {lock:?} is held with token {token} by another client: a token is only good \
             for the client it was granted to"
        ),
        Some(x) => format!(
            "issuer {:?} says lock {lock:?} is held with token {}, not {token}",
            h.issuer, x.token
        ),
        None => format!(
            "issuer {:?} says nobody holds lock {lock:?} right now, so token {token} is not \
             current (expired, released, or never granted)",
            h.issuer
        ),
    };
    state
        .metrics
        .issuer_check(&h.issuer, "not_current", seconds);
    store::record_refusal(
        &state.db,
        id,
        method,
        "token_not_current",
        token,
        &h.issuer,
        h.client_id.as_deref(),
    )
    .await?;
    tracing::info!(page = %id, issuer = %h.issuer, offered = %token, holder = ?holder, "token not current");
    Err(ApiError::TokenNotCurrent {
        issuer: h.issuer.clone(),
        offered: token,
        holder: holder.map(|x| x.token),
        message,
    })
}
