//! The HTTP contract as an OpenAPI 3.1 description, served at
//! `GET /openapi.json` and browsable with Swagger UI at `GET /docs/`.
//!
//! # Made from the code, so that it cannot drift
//! - Every route is registered through utoipa-axum's `OpenApiRouter` with
//!   `routes!(handler)` ([`crate::http::api`]): the path and method a handler
//!   is routed by are the ones its `#[utoipa::path]` annotation declares, so
//!   a route cannot exist without its description, nor the other way round.
//! - Request and response bodies are described by the Rust types the
//!   handlers deserialize and serialize (`#[derive(ToSchema)]`).
//! - The error responses come from [`ErrorCode`], the one list the gateway's
//!   [`ApiError`](crate::ApiError)s answer with: each operation names the
//!   codes it can answer (its `*Errors` type, next to its annotation), and the
//!   description groups them by status, each code's body a component schema
//!   with `error` fixed to the code and its detail fields required.
//!   `error::tests` checks every variant's body against its code's fields;
//!   schemathesis (tests/tests/it/openapi_fuzz.rs) checks the real responses.
//! - The examples are lines of the README's tutorial, which
//!   tests/tests/it/tutorial.rs checks against a running stack; a test here
//!   checks that each one is still in the README.
//!
//! What the description cannot say, and says in words instead: a GET needs
//! the writer's key only when it sends `Fencing-Token` (OpenAPI has no
//! conditional security: the GET lists "none or a writer's key"); a PUT needs
//! `Fencing-Token` only where fencing is enforced (428 otherwise), and which
//! issuers a gateway trusts (`--issuer`) and which keys it knows are per
//! deployment. The event stream's schema describes one event, the convention
//! of OpenAPI 3.2's `itemSchema` that schemathesis follows for 3.1.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use axum::extract::{Extension, Path};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::HeaderName;
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{json, Value};
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::openapi::response::Response as OaResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi, RefOr, Schema};
use utoipa::{IntoParams, Modify};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_swagger_ui::Config;

use crate::error::{ApiError, Detail, ErrorCode};
use crate::AppState;

/// Where the description is served.
pub const SPEC_PATH: &str = "/openapi.json";
/// Where Swagger UI is served (with its assets under it).
pub const DOCS_PATH: &str = "/docs/";

/// The description as `GET /openapi.json` serves it: made once by whoever
/// assembles the routes ([`crate::http::description_json`]) and handed to
/// [`router`]'s handler as a request extension.
#[derive(Clone, Copy)]
pub struct Served(pub &'static str);

/// The base of the description ([`BaseDoc`]): info, tags, security schemes
/// and the error components, to which the routes add their paths.
pub fn base() -> OpenApi {
    <BaseDoc as utoipa::OpenApi>::openapi()
}

/// What the annotations cannot say: every object the gateway sends or takes
/// has exactly its declared fields (`additionalProperties: false`); `ETag`,
/// `Location` and `WWW-Authenticate` are always sent (`required`; `Link`,
/// the lists' next page, only while a page is full), `ETag` a quoted
/// version. A JSON value, not utoipa's `OpenApi`: these touches use
/// fields utoipa's types do not have (a header's `required`).
pub fn document(spec: OpenApi) -> Value {
    let mut value = serde_json::to_value(&spec).expect("the description is JSON");
    if let Some(schemas) = value
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        for schema in schemas.values_mut() {
            if schema["type"] == "object" && schema.get("additionalProperties").is_none() {
                schema["additionalProperties"] = Value::Bool(false);
            }
        }
    }
    let operations = value
        .get_mut("paths")
        .and_then(Value::as_object_mut)
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut());
    for operation in operations {
        let responses = operation
            .get_mut("responses")
            .and_then(Value::as_object_mut)
            .into_iter()
            .flat_map(|responses| responses.values_mut());
        for response in responses {
            let Some(headers) = response.get_mut("headers").and_then(Value::as_object_mut) else {
                continue;
            };
            for (name, header) in headers.iter_mut() {
                header["required"] = Value::Bool(name != "Link");
                if name == "ETag" {
                    header["schema"] = json!({"type": "string", "pattern": "^\"[0-9]{1,19}\"$"});
                }
            }
        }
    }
    value
}

/// `/openapi.json` and `/docs`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(openapi_json))
        .routes(routes!(docs_redirect))
        .routes(routes!(docs_index))
        .routes(routes!(docs_asset))
}

/// The fields of the base description: info, tags, security schemes, and
/// the error components; `OpenApiRouter` adds the paths.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Fenced page storage",
        description = "Pages over HTTP on PostgreSQL that refuse stale fencing tokens atomically, \
            take tokens only from known writers (`Authorization: Bearer <key>`), and only when \
            the lock service that issued them says they are current (`Fencing-Issuer`).\n\n\
            Every refusal is a JSON body `{\"error\": \"<code>\", \"message\": \"...\", ...details}`; \
            the codes each status can carry are listed per operation, and each code's body is \
            a component schema named after it (`stale_token`: `StaleTokenError`).\n\n\
            The README's tutorial walks through every header with a running stack; the \
            examples here are its lines. Browse this description at `/docs/`.",
    ),
    tags(
        (name = "pages", description = "Fenced page storage"),
        (name = "admin", description = "Operators: setting a page's fence (docs/OPERATIONS.md)"),
        (name = "operations", description = "Health, readiness, Prometheus metrics"),
        (name = "dashboard", description = "The live dashboard and its event stream"),
        (name = "docs", description = "This description and its browsable view"),
    ),
    modifiers(&Components)
)]
pub struct BaseDoc;

/// Security schemes and error components.
struct Components;

impl Modify for Components {
    fn modify(&self, openapi: &mut OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            WRITER_KEY,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A writer's API key (`--api-keys`, `--api-keys-file`). Needed for a PUT \
                         and for any request carrying `Fencing-Token`; the key's client is the \
                         writer the history records. Missing or unknown: 401 `unauthorized` \
                         with `WWW-Authenticate: Bearer`.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            ADMIN_KEY,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An admin's API key (`--admin-keys`, `--admin-keys-file`), for the admin \
                         endpoint only. A writer's key there: 403 `forbidden`.",
                    ))
                    .build(),
            ),
        );
        for code in ErrorCode::ALL {
            components
                .schemas
                .insert(error_schema_name(code), error_schema(code));
        }
    }
}

/// The security scheme of writers' keys.
pub const WRITER_KEY: &str = "writer_key";
/// The security scheme of admins' keys.
pub const ADMIN_KEY: &str = "admin_key";

// ---- error bodies ----

/// The component schema of `code`'s body, e.g. `StaleTokenError`.
pub fn error_schema_name(code: ErrorCode) -> String {
    format!("{code:?}Error")
}

fn detail_schema(detail: Detail) -> Value {
    let token = json!({"type": "integer", "format": "int64", "minimum": 0});
    match detail {
        Detail::Text => json!({"type": "string"}),
        Detail::TextList => json!({"type": "array", "items": {"type": "string"}}),
        Detail::Token | Detail::Version => token,
        Detail::TokenOrNull | Detail::VersionOrNull => {
            json!({"type": ["integer", "null"], "format": "int64", "minimum": 0})
        }
        Detail::FenceOrNull => json!({"oneOf": [
            {"type": "null"},
            {"$ref": "#/components/schemas/Fence"}
        ]}),
        Detail::Method => json!({"type": "string", "enum": ["GET", "PUT"]}),
        Detail::Count => json!({"type": "integer", "minimum": 0}),
        Detail::Flag => json!({"type": "boolean"}),
    }
}

/// `{"error": <code>, "message": string, ...details}`, every field required,
/// no others.
fn error_schema(code: ErrorCode) -> RefOr<Schema> {
    let mut properties = serde_json::Map::new();
    properties.insert(
        "error".into(),
        json!({"type": "string", "enum": [code.as_str()]}),
    );
    properties.insert(
        "message".into(),
        json!({"type": "string", "minLength": 1, "description": "For people; may change."}),
    );
    let mut required = vec![json!("error"), json!("message")];
    for (name, detail) in code.details() {
        properties.insert((*name).into(), detail_schema(*detail));
        required.push(json!(name));
    }
    from_json(json!({
        "type": "object",
        "description": format!("{} {}: {}.", code.status().as_u16(), code.as_str(), code.meaning()),
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    }))
}

/// The responses of `codes`, one per status: its body one of the codes'
/// schemas (told apart by `error`), with the tutorial's examples where it
/// has some. A 401 carries `WWW-Authenticate: Bearer`.
pub fn error_responses(codes: &[ErrorCode]) -> BTreeMap<String, RefOr<OaResponse>> {
    let mut by_status: BTreeMap<u16, Vec<ErrorCode>> = BTreeMap::new();
    for &code in codes {
        by_status
            .entry(code.status().as_u16())
            .or_default()
            .push(code);
    }
    by_status
        .into_iter()
        .map(|(status, codes)| {
            let description = codes
                .iter()
                .map(|c| format!("`{}`: {}", c.as_str(), c.meaning()))
                .collect::<Vec<_>>()
                .join("; ");
            let refs: Vec<Value> = codes
                .iter()
                .map(|&c| json!({"$ref": format!("#/components/schemas/{}", error_schema_name(c))}))
                .collect();
            let mapping: serde_json::Map<String, Value> = codes
                .iter()
                .map(|&c| {
                    (
                        c.as_str().to_owned(),
                        json!(format!("#/components/schemas/{}", error_schema_name(c))),
                    )
                })
                .collect();
            let mut media = json!({
                "schema": {
                    "oneOf": refs,
                    "discriminator": {"propertyName": "error", "mapping": mapping},
                },
            });
            let examples: serde_json::Map<String, Value> = codes
                .iter()
                .filter_map(|&c| {
                    tutorial_error(c).map(|line| {
                        (
                            c.as_str().to_owned(),
                            json!({"summary": "from the README's tutorial", "value": parse(line)}),
                        )
                    })
                })
                .collect();
            if !examples.is_empty() {
                media["examples"] = Value::Object(examples);
            }
            let mut response = json!({
                "description": description,
                "content": {"application/json": media},
            });
            if status == 401 {
                response["headers"] = json!({"WWW-Authenticate": {
                    "description": "`Bearer`",
                    "required": true,
                    "schema": {"type": "string", "enum": ["Bearer"]},
                }});
            }
            (status.to_string(), from_json(response))
        })
        .collect()
}

/// Declares `$name`, the error responses of an operation, for its
/// `responses(...)`: the codes listed, and the two any request can meet,
/// 500 `internal` (a panic, caught) and 504 `timeout` (its deadline passed
/// before anything was sent to the database).
macro_rules! errors {
    ($(#[$meta:meta])* $vis:vis $name:ident = [$($code:ident),* $(,)?]) => {
        $(#[$meta])*
        $vis struct $name;
        impl utoipa::IntoResponses for $name {
            fn responses() -> std::collections::BTreeMap<
                String,
                utoipa::openapi::RefOr<utoipa::openapi::response::Response>,
            > {
                $crate::openapi::error_responses(&[
                    $($crate::error::ErrorCode::$code,)*
                    $crate::error::ErrorCode::Internal,
                    $crate::error::ErrorCode::Timeout,
                ])
            }
        }
    };
}
pub(crate) use errors;

// ---- the tutorial's lines ----

/// Bodies of the README's tutorial, as they are written there (a test
/// checks that each is still in the README).
pub mod tutorial {
    /// Step 2: Alice's first write (201).
    pub const PAGE_CREATED: &str = r#"{"id":"tutorial","body":"draft by alice","version":1,"fence":{"issuer":"redis","token":1}}"#;
    /// Step 4: Bob's write with his higher token (200).
    pub const PAGE_UPDATED: &str = r#"{"id":"tutorial","body":"final text by bob","version":2,"fence":{"issuer":"redis","token":2}}"#;
    /// Step 5: the admin lowers the fence.
    pub const FENCE_SET: &str = r#"{"fence":{"issuer":"redis","token":1},"id":"tutorial","previous_fence":{"issuer":"redis","token":2},"version":3}"#;
    /// Step 5: the admin's request body.
    pub const FENCE_BODY: &str =
        r#"{"issuer":"redis","token":1,"reason":"redis restarted without persistence"}"#;
    /// Step 2: a PUT's body.
    pub const PUT_BODY: &str = r#"{"body":"draft by alice"}"#;
    pub const PAGE_NOT_FOUND: &str = r#"{"error":"page_not_found","fence":null,"id":"tutorial","message":"page \"tutorial\" does not exist"}"#;
    pub const UNAUTHORIZED: &str = r#"{"error":"unauthorized","message":"this gateway requires an API key for writes and fenced requests: send Authorization: Bearer <key>"}"#;
    pub const TOKEN_NOT_CURRENT: &str = r#"{"error":"token_not_current","holder_token":2,"issuer":"redis","message":"issuer \"redis\" says lock \"page:tutorial\" is held with token 2, not 1","offered_token":1}"#;
    pub const CLIENT_ID_MISMATCH: &str = r#"{"client_id":"bob","error":"client_id_mismatch","message":"Client-Id \"alice\" is not the client of this API key (\"bob\"); omit Client-Id or send the key's client"}"#;
    pub const STALE_TOKEN: &str = r#"{"current_token":2,"error":"stale_token","issuer":"redis","message":"fencing token 1 is older than the page's fence 2","offered_token":1}"#;

    /// Every line above, for the test.
    pub const ALL: [&str; 10] = [
        PAGE_CREATED,
        PAGE_UPDATED,
        FENCE_SET,
        FENCE_BODY,
        PUT_BODY,
        PAGE_NOT_FOUND,
        UNAUTHORIZED,
        TOKEN_NOT_CURRENT,
        CLIENT_ID_MISMATCH,
        STALE_TOKEN,
    ];
}

fn tutorial_error(code: ErrorCode) -> Option<&'static str> {
    Some(match code {
        ErrorCode::PageNotFound => tutorial::PAGE_NOT_FOUND,
        ErrorCode::Unauthorized => tutorial::UNAUTHORIZED,
        ErrorCode::TokenNotCurrent => tutorial::TOKEN_NOT_CURRENT,
        ErrorCode::ClientIdMismatch => tutorial::CLIENT_ID_MISMATCH,
        ErrorCode::StaleToken => tutorial::STALE_TOKEN,
        _ => return None,
    })
}

/// A tutorial line as JSON (for `example = ...` in annotations).
pub fn parse(line: &str) -> Value {
    serde_json::from_str(line).expect("the tutorial's lines are JSON")
}

/// A piece of the description written as JSON.
#[track_caller]
fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("a valid piece of OpenAPI")
}

// ---- bodies the derive cannot say ----

/// `POST /admin/pages/{id}/fence`'s body: `issuer` and `token` both set, or
/// both `null` or left out (else 400 `invalid_fence`); `reason` 1 to 1000
/// characters once trimmed, no NUL (else 400 `invalid_reason`); `force`
/// optional.
pub fn fence_body_schema() -> RefOr<Schema> {
    // What `str::trim` takes away: Unicode's White_Space, spelled out, since
    // `\s` means other sets in other regex engines (Python's adds U+001C to
    // U+001F, ECMAScript's U+FEFF and not U+0085).
    const WHITE_SPACE: &str = "\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000";
    let reason = json!({
        "type": "string",
        "minLength": 1,
        "maxLength": 1000,
        "pattern": format!("^[^\\u0000]*[^\\u0000{WHITE_SPACE}][^\\u0000]*$"),
        "description": "Why: 1 to 1000 characters, not only spaces, no NUL. The history keeps it.",
    });
    let force = json!({
        "type": "boolean",
        "default": false,
        "description": "Set a token above what the issuer says it has minted for the page's \
            lock (or when it cannot say): otherwise 409 `force_required`. The history records it.",
    });
    from_json(json!({
        "description": "The fence an admin sets: `issuer` and `token` together, or both `null` \
            (or left out) to clear it; and why.",
        "oneOf": [
            {
                "title": "Set the fence",
                "type": "object",
                "properties": {
                    "issuer": {
                        "type": "string",
                        "pattern": "^[a-z0-9._:-]{1,64}$",
                        "description": "The lock service, as the gateway names it (`Fencing-Issuer`).",
                    },
                    "token": {"type": "integer", "format": "int64", "minimum": 0},
                    "reason": reason,
                    "force": force,
                },
                "required": ["issuer", "token", "reason"],
                "additionalProperties": false,
            },
            {
                "title": "Clear the fence",
                "type": "object",
                "properties": {
                    "issuer": {"type": "null"},
                    "token": {"type": "null"},
                    "reason": reason,
                    "force": force,
                },
                "required": ["reason"],
                "additionalProperties": false,
            },
        ],
    }))
}

/// One server-sent event of `/dashboard/events`: a `snapshot` first (with
/// `retry: 1000`), then `update`s, or a `problem` that ends the stream, or
/// a `resync` followed by a new `snapshot`. `data` is the JSON text of a
/// `Snapshot` or an `Update` (its `contentSchema`), or a line of text for a
/// `problem` or a `resync`.
pub fn dashboard_event_schema() -> RefOr<Schema> {
    from_json(json!({
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "event": {"type": "string", "enum": ["snapshot"]},
                    "data": {"type": "string", "contentMediaType": "application/json",
                        "contentSchema": {"$ref": "#/components/schemas/Snapshot"}},
                    "retry": {"type": "integer", "minimum": 0},
                },
                "required": ["event", "data"],
            },
            {
                "type": "object",
                "properties": {
                    "event": {"type": "string", "enum": ["update"]},
                    "data": {"type": "string", "contentMediaType": "application/json",
                        "contentSchema": {"$ref": "#/components/schemas/Update"}},
                },
                "required": ["event", "data"],
            },
            {
                "type": "object",
                "properties": {
                    "event": {"type": "string", "enum": ["problem", "resync"]},
                    "data": {"type": "string"},
                },
                "required": ["event", "data"],
            },
        ],
    }))
}

// ---- parameters ----

/// The page id in the path.
pub struct PageIdParam;

impl IntoParams for PageIdParam {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![from_json(json!({
            "name": "id",
            "in": "path",
            "required": true,
            "description": "The page: 1 to 128 characters of A-Z, a-z, 0-9, '_' and '-' \
                (otherwise 400 `invalid_page_id`).",
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"},
            "example": "tutorial",
        }))]
    }
}

/// An optional request header.
fn header(name: &str, description: &str, schema: Value, example: Value) -> Parameter {
    from_json(json!({
        "name": name,
        "in": "header",
        "required": false,
        "description": description,
        "schema": schema,
        "example": example,
    }))
}

fn fencing_token() -> Parameter {
    header(
        "Fencing-Token",
        "The token of your lock grant: plain decimal digits, 0 to 2^63-1 \
         (otherwise 400 `invalid_fencing_token`). Sending it needs a writer's key. With \
         fencing enforced, the token's issuer is asked whether it is current (409 \
         `token_not_current`, 503 `issuer_unavailable`), then the page's fence refuses it \
         if it is older (409 `stale_token`); the fence then moves up to it.",
        json!({"type": "integer", "format": "int64", "minimum": 0}),
        json!(1),
    )
}

fn fencing_issuer() -> Parameter {
    header(
        "Fencing-Issuer",
        "The lock service that issued the token, as this gateway names it \
         (`--issuer NAME=URL`): `[a-z0-9._:-]{1,64}`, default `default`. Not one it \
         checks tokens with: 409 `unknown_issuer`. Tokens of different issuers are not \
         comparable: each page is guarded by one issuer (its fence's, else the one the \
         operator's `--page-issuers` / `--default-issuer` names for it), and a token of \
         another answers 409 `issuer_mismatch`; a page no rule names one for, 409 \
         `no_issuer_for_page`.",
        json!({"type": "string", "pattern": "^[a-z0-9._:-]{1,64}$", "default": "default"}),
        json!("redis"),
    )
}

fn client_id() -> Parameter {
    header(
        "Client-Id",
        "Optional: who you are. With keys required it must be the key's client \
         (403 `client_id_mismatch`); the history records the key's client either way. \
         1 to 128 visible ASCII characters, no spaces (else 400 `invalid_client_id`).",
        json!({"type": "string", "pattern": "^[!-~]{1,128}$"}),
        json!("alice"),
    )
}

fn if_match() -> Parameter {
    header(
        "If-Match",
        "Write only if the page is at this version (its `ETag`): `\"3\"` \
         (also `W/\"3\"` or `3`). Another version, or no page: 412 `version_mismatch`.",
        json!({"type": "string", "pattern": "^(W/)?(\"[0-9]{1,18}\"|[0-9]{1,18})$"}),
        json!("\"1\""),
    )
}

/// The headers of a fenced read.
pub struct ReadHeaders;

impl IntoParams for ReadHeaders {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let mut if_match = if_match();
        if_match.description = Some(
            "Checked for its form only (400 `invalid_if_match`): a GET is not conditional, \
             the page is answered whatever its version."
                .into(),
        );
        vec![fencing_token(), fencing_issuer(), client_id(), if_match]
    }
}

/// The headers of a write.
pub struct WriteHeaders;

impl IntoParams for WriteHeaders {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![fencing_token(), fencing_issuer(), client_id(), if_match()]
    }
}

// ---- /openapi.json and /docs ----

errors!(
    /// What any request can meet (see [`errors!`]), for operations with no
    /// other error.
    pub AnyRequestErrors = []
);
errors!(DocsAssetErrors = [NotFound, InvalidPath]);

/// This description.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "docs",
    responses(
        (status = 200, description = "This OpenAPI 3.1 description", content_type = "application/json",
            body = Object),
        AnyRequestErrors,
    )
)]
async fn openapi_json(Extension(Served(json)): Extension<Served>) -> Response {
    (
        [
            (CONTENT_TYPE, "application/json"),
            (CACHE_CONTROL, "no-cache"),
        ],
        json,
    )
        .into_response()
}

/// Swagger UI's configuration: this gateway's description, nothing fetched
/// from elsewhere (no validator badge, which would ask swagger.io).
fn swagger_config() -> Arc<Config<'static>> {
    static CONFIG: LazyLock<Arc<Config<'static>>> = LazyLock::new(|| {
        Arc::new(
            Config::from(SPEC_PATH)
                .validator_url("none")
                .try_it_out_enabled(true)
                .persist_authorization(false),
        )
    });
    CONFIG.clone()
}

/// Nothing but this gateway; Swagger UI sets styles inline and draws with
/// `data:` images.
const DOCS_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                        connect-src 'self'; img-src 'self' data:; font-src 'self' data:; \
                        base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn swagger_file(file: &str) -> Result<Response, ApiError> {
    match utoipa_swagger_ui::serve(file, swagger_config()) {
        Ok(Some(f)) => Ok((
            [
                (CONTENT_TYPE, f.content_type),
                (CACHE_CONTROL, "no-cache".to_owned()),
                (
                    HeaderName::from_static("content-security-policy"),
                    DOCS_CSP.to_owned(),
                ),
                (
                    HeaderName::from_static("x-content-type-options"),
                    "nosniff".to_owned(),
                ),
            ],
            f.bytes.into_owned(),
        )
            .into_response()),
        Ok(None) => Err(ApiError::NoRoute(format!("GET {DOCS_PATH}{file}"))),
        Err(e) => Err(ApiError::Internal(format!("swagger ui: {e}"))),
    }
}

/// To `/docs/`, where the UI's relative asset paths resolve.
#[utoipa::path(
    get,
    path = "/docs",
    operation_id = "docs_redirect",
    tag = "docs",
    responses(
        (status = 303, description = "To `/docs/`", headers(("Location" = String, description = "`/docs/`"))),
        AnyRequestErrors,
    )
)]
async fn docs_redirect() -> Redirect {
    Redirect::to(DOCS_PATH)
}

/// Swagger UI: this description, browsable, with "Try it out" against this
/// gateway. Its assets are compiled into the binary (the
/// utoipa-swagger-ui-vendored crate); nothing is fetched from elsewhere.
#[utoipa::path(
    get,
    path = "/docs/",
    operation_id = "docs",
    tag = "docs",
    responses(
        (status = 200, description = "Swagger UI", content_type = "text/html", body = String),
        AnyRequestErrors,
    )
)]
async fn docs_index() -> Result<Response, ApiError> {
    swagger_file("index.html")
}

/// One of Swagger UI's assets (`swagger-ui.css`, `swagger-ui-bundle.js`, ...).
#[utoipa::path(
    get,
    path = "/docs/{file}",
    operation_id = "docs_asset",
    tag = "docs",
    params(("file" = String, Path, description = "An asset of Swagger UI", example = "swagger-ui.css")),
    responses(
        (status = 200, description = "The asset", content(
            ("text/css"), ("text/javascript"), ("application/javascript"), ("text/html"),
            ("image/png"), ("application/json"), ("application/octet-stream")
        )),
        DocsAssetErrors,
    )
)]
async fn docs_asset(Path(file): Path<String>) -> Result<Response, ApiError> {
    swagger_file(&file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tutorial_examples_are_lines_of_the_tutorial() {
        let tutorial = include_str!("../../docs/TUTORIAL.md");
        for line in tutorial::ALL {
            assert!(
                tutorial.contains(line),
                "not in docs/TUTORIAL.md any more: {line}"
            );
            parse(line);
        }
    }

    #[test]
    fn the_codes_of_one_status_share_its_response() {
        let responses = error_responses(&[ErrorCode::StaleToken, ErrorCode::TokenNotCurrent]);
        assert_eq!(responses.keys().collect::<Vec<_>>(), ["409"]);
    }
}
