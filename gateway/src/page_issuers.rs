//! Which lock service guards each page: the operator's choice, never the
//! first client's.
//!
//! A page's issuer is, in this order: the one its row already carries (set
//! by an admin through `POST /admin/pages/{id}/fence`, or by an access
//! accepted under this rule); the first `PATTERN=ISSUER` of
//! `GATEWAY_PAGE_ISSUERS` whose pattern matches the page id (a page id, or a
//! glob where `*` stands for any run of characters); `GATEWAY_DEFAULT_ISSUER`
//! (by default the only configured issuer, when exactly one is configured).
//! A fenced access with another issuer's token is refused `issuer_mismatch`,
//! one on a page no rule names an issuer for `no_issuer_for_page`; both are
//! recorded and move nothing. Fencing off ignores all of it.
//!
//! A gateway with no issuer configured checks no token with anybody; there
//! the page's first fenced access still chooses its issuer, as nothing else
//! is checked either (the start-up log says so).

use std::fmt;
use std::str::FromStr;

use crate::issuers::valid_issuer_name;

/// One `PATTERN=ISSUER` of `GATEWAY_PAGE_ISSUERS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageIssuer {
    /// A page id, or a glob with `*`.
    pub pattern: String,
    pub issuer: String,
}

impl FromStr for PageIssuer {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let Some((pattern, issuer)) = s.trim().split_once('=') else {
            return Err(format!(
                "page issuer {s:?}: expected PATTERN=ISSUER, e.g. tutorial=redis or demo-*=zookeeper"
            ));
        };
        let (pattern, issuer) = (pattern.trim(), issuer.trim());
        let pattern_ok = (1..=128).contains(&pattern.len())
            && pattern
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'*'));
        if !pattern_ok {
            return Err(format!(
                "page issuer {s:?}: the pattern must be a page id ([A-Za-z0-9_-]{{1,128}}) where \
                 `*` may stand for any run of characters"
            ));
        }
        if !valid_issuer_name(issuer) {
            return Err(format!(
                "page issuer {s:?}: the issuer must match [a-z0-9._:-]{{1,64}}"
            ));
        }
        Ok(PageIssuer {
            pattern: pattern.to_owned(),
            issuer: issuer.to_owned(),
        })
    }
}

impl fmt::Display for PageIssuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.pattern, self.issuer)
    }
}

/// `PATTERN=ISSUER` entries separated by commas or spaces.
pub fn parse_list(list: &str) -> Result<Vec<PageIssuer>, String> {
    list.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|e| !e.is_empty())
        .map(str::parse)
        .collect()
}

/// Whether glob `pattern` (`*`: any run of characters) matches all of `id`.
pub fn glob_matches(pattern: &str, id: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = id.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: the whole id
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The operator's rule, resolved at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageIssuers {
    /// No issuer is configured, so no token is checked with anybody: a
    /// page's first fenced access chooses its issuer.
    FirstAccess,
    /// Patterns, first match wins, then the default.
    Chosen {
        patterns: Vec<PageIssuer>,
        default: Option<String>,
    },
}

impl PageIssuers {
    /// The rule for these settings: `configured` are the issuer names. With
    /// none configured, [`PageIssuers::FirstAccess`] (and no pattern nor
    /// default may be given); else every issuer named must be configured,
    /// and the default defaults to the only configured issuer.
    pub fn new(
        configured: &[&str],
        patterns: Vec<PageIssuer>,
        default: Option<String>,
    ) -> Result<Self, String> {
        let named = patterns
            .iter()
            .map(|p| (p.issuer.as_str(), "GATEWAY_PAGE_ISSUERS"));
        let named = named.chain(default.as_deref().map(|d| (d, "GATEWAY_DEFAULT_ISSUER")));
        for (issuer, setting) in named {
            if !configured.contains(&issuer) && !mints_no_tokens(issuer) {
                return Err(format!(
                    "{setting} names issuer {issuer:?}, which is not configured (GATEWAY_ISSUERS \
                     has {configured:?}): a page's issuer must be one whose tokens are checked"
                ));
            }
        }
        if configured.is_empty() {
            return Ok(PageIssuers::FirstAccess);
        }
        let default = default.or_else(|| match configured {
            [only] => Some((*only).to_owned()),
            _ => None,
        });
        Ok(PageIssuers::Chosen { patterns, default })
    }

    /// The issuer that guards `page` when its row carries none; with
    /// [`PageIssuers::FirstAccess`], the offered token's own. None when no
    /// rule names one, or the one named mints no tokens (Redlock).
    pub fn issuer_for<'a>(&'a self, page: &str, offered: &'a str) -> Option<&'a str> {
        match self {
            PageIssuers::FirstAccess => Some(offered),
            PageIssuers::Chosen { patterns, default } => patterns
                .iter()
                .find(|p| glob_matches(&p.pattern, page))
                .map(|p| p.issuer.as_str())
                .or(default.as_deref())
                .filter(|issuer| !mints_no_tokens(issuer)),
        }
    }

    /// The lock services the rule names that mint no fencing token: their
    /// pages are refused every fenced access (`no_issuer_for_page`).
    pub fn tokenless(&self) -> Vec<&str> {
        match self {
            PageIssuers::FirstAccess => Vec::new(),
            PageIssuers::Chosen { patterns, default } => patterns
                .iter()
                .map(|p| p.issuer.as_str())
                .chain(default.as_deref())
                .filter(|issuer| mints_no_tokens(issuer))
                .collect(),
        }
    }
}

/// Whether `issuer` names a lock service without fencing tokens (Redlock):
/// a rule may name it, so that one setting can follow the workers' backend,
/// but nothing can be checked, so its pages take no fenced access.
fn mints_no_tokens(issuer: &str) -> bool {
    issuer
        .parse::<fencelock::Backend>()
        .is_ok_and(|b| !b.mints_tokens())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_the_whole_id() {
        for (pattern, matching, not_matching) in [
            ("tutorial", &["tutorial"][..], &["tutorial-2"][..]),
            ("demo-*", &["demo-1", "demo-"], &["xdemo-1"]),
            ("*", &["anything"], &[]),
            ("*-zk", &["page-zk"], &["page-zk-no"]),
            ("a*b*c", &["aXbYc", "abc"], &["acb"]),
            ("ab*ba", &[], &["aba"]),
        ] {
            for id in matching {
                assert!(glob_matches(pattern, id), "{pattern} on {id}");
            }
            for id in not_matching {
                assert!(!glob_matches(pattern, id), "{pattern} on {id}");
            }
        }
    }

    #[test]
    fn a_rule_may_name_redlock_whose_pages_get_no_issuer() {
        let rule = PageIssuers::new(
            &["zookeeper"],
            parse_list("demo=redlock").unwrap(),
            Some("redlock".into()),
        )
        .unwrap();
        assert_eq!(rule.issuer_for("demo", "zookeeper"), None);
        assert_eq!(rule.issuer_for("other", "zookeeper"), None);
        assert_eq!(rule.tokenless(), ["redlock", "redlock"]);
        assert!(PageIssuers::new(&["zookeeper"], Vec::new(), Some("redis".into())).is_err());
    }

    #[test]
    fn the_first_matching_pattern_wins_then_the_default() {
        let patterns =
            parse_list("tutorial=redis, sentinel=redis-sentinel demo-*=zookeeper *-x=redis")
                .unwrap();
        let rule = PageIssuers::new(
            &["redis", "redis-sentinel", "zookeeper"],
            patterns,
            Some("zookeeper".into()),
        )
        .unwrap();
        for (page, issuer) in [
            ("tutorial", "redis"),
            ("sentinel", "redis-sentinel"),
            ("demo-x", "zookeeper"),
            ("other-x", "redis"),
            ("failover", "zookeeper"),
        ] {
            assert_eq!(rule.issuer_for(page, "offered"), Some(issuer), "{page}");
        }
    }

    #[test]
    fn the_default_is_the_only_issuer_or_none_and_named_issuers_must_be_configured() {
        let one = PageIssuers::new(&["redis"], vec![], None).unwrap();
        assert_eq!(one.issuer_for("p", "zookeeper"), Some("redis"));
        let two = PageIssuers::new(&["redis", "zookeeper"], vec![], None).unwrap();
        assert_eq!(two.issuer_for("p", "redis"), None);
        let none = PageIssuers::new(&[], vec![], None).unwrap();
        assert_eq!(none, PageIssuers::FirstAccess);
        assert_eq!(none.issuer_for("p", "redis"), Some("redis"));

        let err = PageIssuers::new(&["redis"], parse_list("p=zk").unwrap(), None).unwrap_err();
        assert!(
            err.contains("GATEWAY_PAGE_ISSUERS") && err.contains("\"zk\""),
            "{err}"
        );
        let err = PageIssuers::new(&[], vec![], Some("redis".into())).unwrap_err();
        assert!(err.contains("GATEWAY_DEFAULT_ISSUER"), "{err}");
    }

    #[test]
    fn malformed_entries_say_what_is_expected() {
        for (list, said) in [
            ("tutorial", "PATTERN=ISSUER"),
            ("a.b=redis", "pattern"),
            ("p=Redis", "issuer"),
            ("=redis", "pattern"),
        ] {
            let err = parse_list(list).unwrap_err();
            assert!(err.contains(said), "{list}: {err}");
        }
        assert_eq!(parse_list(" , ").unwrap(), vec![]);
    }
}
