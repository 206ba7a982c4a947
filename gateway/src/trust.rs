//! What the gateway trusts: which keys may write ([`crate::auth`]), which lock
//! services' tokens it checks ([`crate::issuers`]), which of them guards each
//! page ([`crate::page_issuers`]), and the start-up rules and warnings that
//! go with them.

use std::time::Duration;

use crate::auth::{AuthMode, KeyRing};
use crate::issuers::{IssuerSpec, Issuers, DEFAULT_ISSUER_TIMEOUT, DEFAULT_MAX_TOKEN_JUMP};
use crate::page_issuers::{PageIssuer, PageIssuers};
use crate::FenceCheck;

/// The trust settings, parsed and validated but not started (no connection
/// made). Keys are already digests. Build it from flags with
/// [`crate::Config::trust_options`], or with [`crate::GatewayOptions`].
#[derive(Debug, Clone)]
pub struct TrustOptions {
    pub auth: AuthMode,
    /// Writers: the name is the history's `client_id`.
    pub writers: KeyRing,
    /// Admins: may call `POST /admin/pages/{id}/fence`, nothing else.
    pub admins: KeyRing,
    pub issuers: Vec<IssuerSpec>,
    /// How long an issuer may take to answer before 503 `issuer_unavailable`.
    pub issuer_timeout: Duration,
    /// `GATEWAY_PAGE_ISSUERS`: the issuer of the pages each pattern matches.
    pub page_issuers: Vec<PageIssuer>,
    /// `GATEWAY_DEFAULT_ISSUER`; unset: the only configured issuer, if one.
    pub default_issuer: Option<String>,
    /// How far above a page's fence a Redis token may be before it is
    /// refused as `suspected_forgery` (0: no bound); see
    /// [`IssuerSpec::bounds_jumps`].
    pub max_token_jump: u64,
}

impl TrustOptions {
    /// Authentication off, no keys, no issuers: as a gateway without either.
    pub fn off() -> Self {
        TrustOptions {
            auth: AuthMode::Off,
            writers: KeyRing::new(),
            admins: KeyRing::new(),
            issuers: Vec::new(),
            issuer_timeout: DEFAULT_ISSUER_TIMEOUT,
            page_issuers: Vec::new(),
            default_issuer: None,
            max_token_jump: DEFAULT_MAX_TOKEN_JUMP,
        }
    }

    /// The page issuers' rule: every issuer it names must be configured.
    pub fn page_rule(&self) -> Result<PageIssuers, String> {
        let configured: Vec<&str> = self.issuers.iter().map(|s| s.name.as_str()).collect();
        PageIssuers::new(
            &configured,
            self.page_issuers.clone(),
            self.default_issuer.clone(),
        )
    }

    /// The rules that make the gateway refuse to start.
    pub fn validate(&self) -> Result<(), String> {
        if self.auth == AuthMode::Required && self.writers.is_empty() {
            return Err(
                "authentication is required (GATEWAY_AUTH=required, the default) but no API key \
                 is configured. Give the writers' keys with GATEWAY_API_KEYS=client=key,client=key \
                 (--api-keys) or GATEWAY_API_KEYS_FILE=<file with one client=key a line> \
                 (--api-keys-file), keys of at least 16 bytes; or set GATEWAY_AUTH=off \
                 (--auth off) to let anybody write"
                    .into(),
            );
        }
        if let Some((writer, admin)) = self.writers.shared_name(&self.admins) {
            return Err(format!(
                "the key of writer {writer:?} is also the key of admin {admin:?}: an admin key \
                 must not be a writer key"
            ));
        }
        if let Some(name) = self.admins.names().find(|n| n.len() > 122) {
            return Err(format!(
                "admin name {name:?} is too long: the history records admin:<name> in 128 characters"
            ));
        }
        let mut names: Vec<&str> = self.issuers.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("issuer {:?} is configured twice", w[0]));
        }
        if self.issuer_timeout.is_zero() {
            return Err("the issuer timeout must be above zero".into());
        }
        Ok(())
    }
}

/// The trust settings in force: keys, and the issuers being connected.
#[derive(Debug)]
pub struct Trust {
    pub auth: AuthMode,
    pub writers: KeyRing,
    pub admins: KeyRing,
    /// Empty when none is configured or fencing is off (then nothing is asked).
    pub issuers: Issuers,
    /// Which issuer guards a page whose fence names none (fencing enforced).
    pub page_issuers: PageIssuers,
}

impl Trust {
    /// No authentication, no issuer checks.
    pub fn off() -> Self {
        Trust {
            auth: AuthMode::Off,
            writers: KeyRing::new(),
            admins: KeyRing::new(),
            issuers: Issuers::none(),
            page_issuers: PageIssuers::FirstAccess,
        }
    }

    /// Validate `options`, log what is (and is not) checked, and start
    /// connecting to the issuers in the background, unless fencing is off:
    /// then no token is checked at all, with issuers or not, and no page
    /// has an issuer to choose. Needs a tokio runtime.
    pub fn start(options: TrustOptions, fencing: FenceCheck) -> Result<Self, String> {
        options.validate()?;
        let (issuers, page_issuers) = match fencing {
            FenceCheck::Enforce => {
                let rule = options.page_rule()?;
                log_startup(&options, fencing, Some(&rule));
                let issuers = Issuers::start(
                    &options.issuers,
                    options.issuer_timeout,
                    options.max_token_jump,
                )?;
                (issuers, rule)
            }
            FenceCheck::Off => {
                log_startup(&options, fencing, None);
                (Issuers::none(), PageIssuers::FirstAccess)
            }
        };
        Ok(Trust {
            auth: options.auth,
            writers: options.writers,
            admins: options.admins,
            issuers,
            page_issuers,
        })
    }
}

/// The start-up log: loud where something is not checked.
fn log_startup(o: &TrustOptions, fencing: FenceCheck, rule: Option<&PageIssuers>) {
    match o.auth {
        AuthMode::Required => tracing::info!(
            writers = ?o.writers,
            admins = ?o.admins,
            "authentication required for writes and fenced requests"
        ),
        AuthMode::Off => {
            tracing::warn!(
                "AUTHENTICATION IS OFF (GATEWAY_AUTH=off): anybody who can reach this gateway can \
                 write any page under any Client-Id and move any page's fence"
            );
            if !o.writers.is_empty() {
                tracing::warn!(writers = ?o.writers, "API keys are configured but ignored while authentication is off");
            }
        }
    }
    if o.admins.is_empty() {
        tracing::info!("no admin key: POST /admin/pages/{{id}}/fence answers 401");
    }
    match (fencing, o.issuers.is_empty()) {
        (FenceCheck::Off, true) => tracing::warn!(
            "fencing is off (GATEWAY_FENCING=off): fencing tokens are not checked at all, neither \
             against the page's fence nor with their issuers"
        ),
        (FenceCheck::Off, false) => tracing::warn!(
            issuers = ?o.issuers,
            "fencing is off (GATEWAY_FENCING=off): fencing tokens are not checked at all; the \
             configured issuers are not asked (nor connected to)"
        ),
        (FenceCheck::Enforce, true) => tracing::warn!(
            "no issuer configured (--issuer / GATEWAY_ISSUERS): fencing tokens are not checked \
             with their issuers, so a client may send any token that is not below a page's fence"
        ),
        (FenceCheck::Enforce, false) => {
            tracing::info!(issuers = ?o.issuers, timeout = ?o.issuer_timeout, "fencing tokens are checked with their issuers");
            for spec in &o.issuers {
                let expected = spec.backend.name();
                if spec.name != expected {
                    tracing::warn!(
                        "issuer {:?} is a {:?} backend, whose leases carry Fencing-Issuer {expected:?}: \
                         clients using fencelock send {expected:?}, which this gateway will answer \
                         409 unknown_issuer",
                        spec.name,
                        spec.backend
                    );
                }
            }
        }
    }
    match rule {
        Some(rule @ PageIssuers::Chosen { patterns, default }) => {
            let tokenless = rule.tokenless();
            if !tokenless.is_empty() {
                tracing::warn!(?tokenless, "the page issuers name a lock service without fencing tokens: its pages are refused every fenced access (409 no_issuer_for_page)");
            }
            let patterns: Vec<String> = patterns.iter().map(ToString::to_string).collect();
            tracing::info!(?patterns, ?default, "page issuers: the first matching pattern, else the default; a page whose fence names an issuer keeps it");
            if default.is_none() {
                tracing::warn!("no default issuer (GATEWAY_DEFAULT_ISSUER): fenced accesses of pages no pattern matches, and that are not fenced yet, are refused 409 no_issuer_for_page");
            }
        }
        Some(PageIssuers::FirstAccess) => {
            tracing::warn!("no issuer configured: a page's first fenced access chooses its issuer")
        }
        None if !o.page_issuers.is_empty() || o.default_issuer.is_some() => tracing::warn!(
            "fencing is off: GATEWAY_PAGE_ISSUERS and GATEWAY_DEFAULT_ISSUER are ignored"
        ),
        None => {}
    }
    if o.max_token_jump == 0 && fencing == FenceCheck::Enforce {
        let unbounded: Vec<&str> = o
            .issuers
            .iter()
            .filter(|s| s.bounds_jumps())
            .map(|s| s.name.as_str())
            .collect();
        tracing::warn!(
            issuers = ?unbounded,
            "TOKEN JUMPS ARE NOT BOUNDED (GATEWAY_MAX_TOKEN_JUMP=0): a Redis lock client that \
             writes its lock's holder hash and counter by hand can move a page's fence as far as \
             2^63-1 and lock every honest writer out of it"
        );
    }
    if o.auth == AuthMode::Off && fencing == FenceCheck::Enforce && !o.issuers.is_empty() {
        tracing::warn!(
            "issuers are checked but authentication is off: the issuer check compares the token, \
             and the holder's client only when the request sends Client-Id"
        );
    }
}
