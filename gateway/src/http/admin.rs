//! The admin endpoint: `POST /admin/pages/{id}/fence`, the way back when a
//! page's fence is above what its issuer can grant, and the operator's way
//! to choose a page's issuer. It sets only fences its issuer can reach: a
//! configured issuer, and a token it has minted, unless the admin forces it.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use fencelock::Token;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorCode};
use crate::issuers::{lock_name, valid_issuer_name};
use crate::metrics::Outcome;
use crate::openapi::{self, errors, PageIdParam};
use crate::store::{self, Fence};
use crate::{AppState, FenceCheck};

use super::extractors::{Admin, JsonBody, PageId};
use super::sorted_json;

/// `POST /admin/pages/{id}/fence`.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(admin_set_fence))
}

/// The fence an admin sets: `issuer` and `token` together, or both `null`
/// (or left out) to clear it; and why; `force` to set a token above what
/// the issuer has minted. Its schema is written by hand
/// ([`openapi::fence_body_schema`]): "both or neither" is not a field's type.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceBody {
    issuer: Option<String>,
    #[serde(default, deserialize_with = "json_token")]
    token: Option<Token>,
    reason: String,
    #[serde(default)]
    force: bool,
}

/// A token in a JSON body: an integer from 0 to 2^63-1, or `null`. JSON
/// Schema, and so the OpenAPI description, counts `28.0` as the integer 28
/// (schemathesis sent one, and serde refused it as not a `u64`), so an
/// integral number written with a fraction is taken too, but only where a
/// double holds it exactly (up to 2^53): a token is never rounded.
fn json_token<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Token>, D::Error> {
    use serde::de::Error;
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    let token = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => Token::new(u),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..=EXACT).contains(&f) => Token::new(f as u64),
        _ => None,
    };
    token.map(Some).ok_or_else(|| {
        D::Error::custom(format!(
            "token must be an integer from 0 to {}, got {n}",
            i64::MAX
        ))
    })
}

impl utoipa::PartialSchema for FenceBody {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        openapi::fence_body_schema()
    }
}

impl ToSchema for FenceBody {}

/// What an admin's fence change did.
#[derive(Serialize, ToSchema)]
pub struct FenceSetReply {
    pub id: String,
    /// The page's version (unchanged by the fence: 0 for a page never written).
    #[schema(minimum = 0)]
    pub version: i64,
    #[schema(required = true)]
    pub fence: Option<Fence>,
    #[schema(required = true)]
    pub previous_fence: Option<Fence>,
}

errors!(
    AdminSetFenceErrors = [
        InvalidPageId,
        InvalidPath,
        InvalidReason,
        InvalidFencingIssuer,
        InvalidFence,
        InvalidJson,
        InvalidBody,
        Unauthorized,
        Forbidden,
        PageNotFound,
        NotFound,
        UnknownIssuer,
        ForceRequired,
        FencingOff,
        BodyTooLarge,
        UnsupportedMediaType,
        IssuerUnavailable,
        DatabaseUnavailable,
    ]
);

/// Set (lower, clear) a page's fence: admins only.
///
/// The way back when a page's fence is above what its issuer can grant (a
/// lock service that lost its counter), and the way to choose a page's
/// issuer; see docs/OPERATIONS.md. The issuer must be one this gateway
/// checks tokens with (409 `unknown_issuer`). The token must not be above
/// what the issuer says it has minted for the page's lock, unless `force`
/// is set (409 `force_required`; also when the issuer cannot say): such a
/// fence refuses every holder until the issuer's counter passes it; the
/// issuer is not asked when `force` is set. Audited by a history row
/// (method `ADMIN`, outcome `fence_set`, client `admin:<name>`, the reason,
/// `force`). Lowering a fence re-opens what it closed. A gateway with
/// fencing off answers 409 `fencing_off`.
#[utoipa::path(
    post,
    path = "/admin/pages/{id}/fence",
    operation_id = "admin_set_fence",
    tag = "admin",
    params(PageIdParam),
    security(("admin_key" = [])),
    request_body(content = FenceBody, content_type = "application/json",
        example = json!(openapi::parse(openapi::tutorial::FENCE_BODY))),
    responses(
        (status = 200, description = "The fence was set", body = FenceSetReply,
            links(
                ("Read" = (operation_id = "get_page", parameters(("id" = "$response.body#/id")))),
                ("History" = (operation_id = "page_history", parameters(("id" = "$response.body#/id")))),
            ),
            example = json!(openapi::parse(openapi::tutorial::FENCE_SET))),
        AdminSetFenceErrors,
    )
)]
#[tracing::instrument(skip_all, fields(page = %id, admin = %admin))]
async fn admin_set_fence(
    State(state): State<AppState>,
    Admin(admin): Admin,
    PageId(id): PageId,
    JsonBody(body): JsonBody<FenceBody>,
) -> Result<Response, ApiError> {
    if state.fencing == FenceCheck::Off {
        return Err(ApiError::FencingOff);
    }
    let reason = body.reason.trim();
    if reason.is_empty() || reason.chars().count() > 1000 || reason.contains('\0') {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidReason,
            "reason must be 1 to 1000 characters (without NUL): the history keeps it",
        ));
    }
    let fence = match (body.issuer, body.token) {
        (Some(issuer), Some(token)) => {
            if !valid_issuer_name(&issuer) {
                return Err(ApiError::bad_request(
                    ErrorCode::InvalidFencingIssuer,
                    format!("issuer must match [a-z0-9._:-]{{1,64}}, got {issuer:?}"),
                ));
            }
            Some(Fence { issuer, token })
        }
        (None, None) => None,
        _ => return Err(ApiError::bad_request(
            ErrorCode::InvalidFence,
            "issuer and token go together: give both to set the fence, or null both to clear it",
        )),
    };
    if let Some(fence) = &fence {
        check_reachable(&state, &id, fence, body.force).await?;
    }
    let client = format!("admin:{admin}");
    let set = store::set_fence(&state.db, &id, fence.as_ref(), &client, reason, body.force)
        .await?
        .ok_or(ApiError::PageNotFound {
            id: id.clone(),
            fence: None,
        })?;
    tracing::warn!(previous = ?set.previous, fence = ?set.fence, reason, "page fence set by an admin");
    let reply = FenceSetReply {
        id,
        version: set.version,
        fence: set.fence,
        previous_fence: set.previous,
    };
    let mut response = sorted_json(&reply)?.into_response();
    response.extensions_mut().insert(Outcome("fence_set"));
    Ok(response)
}

/// A fence the issuer can reach: a configured issuer (any, on a gateway
/// that checks tokens with none), and, unless `force`, a token it says it
/// has minted for the page's lock.
async fn check_reachable(
    state: &AppState,
    id: &str,
    fence: &Fence,
    force: bool,
) -> Result<(), ApiError> {
    let issuers = &state.trust.issuers;
    let issuer = match issuers.get(&fence.issuer) {
        Some(issuer) => Some(issuer),
        None if issuers.is_empty() => None,
        None => {
            return Err(ApiError::UnknownIssuer {
                issuer: fence.issuer.clone(),
                known: issuers.names(),
            })
        }
    };
    if force {
        return Ok(());
    }
    let minted = match issuer {
        Some(issuer) => issuer
            .ask(issuers.timeout(), |lookup| {
                Box::pin(async move { lookup.minted(&lock_name(id)).await })
            })
            .await
            .map_err(|e| ApiError::IssuerUnavailable {
                issuer: fence.issuer.clone(),
                detail: e.to_string(),
            })?,
        None => None,
    };
    match minted {
        Some(m) if fence.token <= m => Ok(()),
        _ => Err(ApiError::ForceRequired {
            issuer: fence.issuer.clone(),
            token: fence.token,
            minted,
        }),
    }
}
