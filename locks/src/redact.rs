//! URLs as they may appear in messages and logs: without their secrets.
//! The one place that says what a secret in a URL is; the gateway and the
//! workers use it too.
//!
//! What counts as a secret in a URL: the password of its userinfo
//! (`scheme://user:PASSWORD@host`, also in multi-host URLs and in a bare
//! `user:PASSWORD@host:port` such as a sentinel list's entry), and the value
//! of a parameter whose name says it is one (`password=`, `sslpassword=`,
//! `pass=`, `pwd=`, `secret=`, `token=`, `auth=`, `key=`, ...) in a query
//! string (`?a=b&password=x`) or in libpq's `key=value` form
//! (`host=db password='x y'`).

use std::borrow::Cow;

use percent_encoding::percent_decode_str;

/// What replaces a secret.
const HIDDEN: &str = "***";

/// `url` without its secrets, for messages and logs: the userinfo's password
/// and every secret parameter's value become `***`. Anything that is not a
/// URL comes back with its secret parameters hidden too. When in doubt it
/// hides more: everything between the scheme and the last `@` (before a
/// `#`) is taken as userinfo.
///
/// ```
/// use fencelock::redact_url;
/// assert_eq!(redact_url("redis://worker:s3cret@r:6379/0"), "redis://worker:***@r:6379/0");
/// assert_eq!(
///     redact_url("mysql://u@db/locks?password=s3cret&ssl-mode=disabled"),
///     "mysql://u@db/locks?password=***&ssl-mode=disabled"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    let url = redact_userinfo(url);
    redact_parameters(&url)
}

/// `text` with every secret of `url` hidden: `url` itself, its password and
/// its secret parameters' values, as written and percent-decoded, wherever
/// they appear. For error texts of drivers and libraries that may quote the
/// URL they were given.
pub fn scrub_secrets(text: &str, url: &str) -> String {
    let mut out = text.replace(url, &redact_url(url));
    let mut secrets = secrets_of(url);
    // The longest first: a secret that holds another is hidden whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets {
        out = out.replace(&secret, HIDDEN);
    }
    out
}

/// [`scrub_secrets`] against each of `urls`.
pub fn scrub_secrets_all<'a>(text: &str, urls: impl IntoIterator<Item = &'a str>) -> String {
    urls.into_iter()
        .fold(text.to_owned(), |text, url| scrub_secrets(&text, url))
}

/// The userinfo's password (everything between the first `:` after the
/// scheme's `//`, or the start, and the last `@`), hidden. A URL that names
/// no password is returned as it is.
fn redact_userinfo(url: &str) -> String {
    match userinfo_password(url) {
        Some((start, end)) => format!("{}{HIDDEN}{}", &url[..start], &url[end..]),
        None => url.to_owned(),
    }
}

/// Where the userinfo's password is in `url`: byte range. The last `@`
/// (before a fragment) is taken as the userinfo's end, so a password holding an `@` (or a `/`) is
/// hidden whole; an `@` later in the URL hides more than the password, never
/// less.
fn userinfo_password(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url.find('#').unwrap_or(url.len()).max(start);
    let at = start + url[start..end].rfind('@')?;
    let colon = start + url[start..at].find(':')?;
    Some((colon + 1, at))
}

/// Whether a parameter of this name holds a secret.
fn is_secret_name(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "credential"]
        .iter()
        .any(|s| name.contains(s))
        || ["auth", "key", "apikey", "api_key", "auth_key"].contains(&name.as_str())
}

/// Where each secret parameter's value is in `s`: byte ranges. A parameter
/// is `name=value` after the start, `?`, `&`, `;` or a space; a value runs
/// to the next `&`, `;` or space, or, quoted (`'x y'`), to its closing
/// quote.
fn secret_values(s: &str) -> Vec<(usize, usize)> {
    let bytes = s.as_bytes();
    let mut found = Vec::new();
    let mut name_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'?' | b'&' | b';' | b' ' | b'\t' | b'\n' => name_start = i + 1,
            b'=' => {
                let mut end = i + 1;
                if bytes.get(end) == Some(&b'\'') {
                    end += 1;
                    while end < bytes.len() && bytes[end] != b'\'' {
                        end += 1 + usize::from(bytes[end] == b'\\');
                    }
                    end = (end + 1).min(bytes.len());
                } else {
                    while end < bytes.len() && !b"&; \t\n".contains(&bytes[end]) {
                        end += 1;
                    }
                }
                if is_secret_name(&s[name_start..i]) && end > i + 1 {
                    found.push((i + 1, end));
                }
                name_start = end;
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

fn redact_parameters(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for (start, end) in secret_values(s) {
        out.push_str(&s[last..start]);
        out.push_str(HIDDEN);
        last = end;
    }
    out.push_str(&s[last..]);
    out
}

/// Every secret `url` holds, as written and percent-decoded (quotes of a
/// quoted value left out too).
fn secrets_of(url: &str) -> Vec<String> {
    let mut raw: Vec<&str> = Vec::new();
    if let Some((start, end)) = userinfo_password(url) {
        raw.push(&url[start..end]);
    }
    for (start, end) in secret_values(url) {
        let value = &url[start..end];
        raw.push(value);
        if let Some(inner) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
            raw.push(inner);
        }
    }
    let mut all: Vec<String> = Vec::new();
    for secret in raw.into_iter().filter(|s| !s.is_empty()) {
        all.push(secret.to_owned());
        if let Cow::Owned(decoded) = percent_decode_str(secret).decode_utf8_lossy() {
            all.push(decoded);
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_passwords_are_hidden_and_users_kept() {
        for (url, shown) in [
            (
                "postgres://u:secret@h:5432/db",
                "postgres://u:***@h:5432/db",
            ),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("redis://:secret@h:6379", "redis://:***@h:6379"),
            (
                "postgres://u:p@ss:w/rd@a:1,b:2/db?target_session_attrs=read-write",
                "postgres://u:***@a:1,b:2/db?target_session_attrs=read-write",
            ),
            ("zookeeper://a:2181,b:2181", "zookeeper://a:2181,b:2181"),
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            ("redis://user@h:1", "redis://user@h:1"),
            (
                "redis-sentinel://w:p%40w@s1:26379,s2:26379/mymaster",
                "redis-sentinel://w:***@s1:26379,s2:26379/mymaster",
            ),
            ("w:pw@s1:26379", "w:***@s1:26379"),
            ("x://u:pw@h/p#frag@x", "x://u:***@h/p#frag@x"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn secret_parameters_are_hidden_in_query_strings_and_key_value_strings() {
        for (url, shown) in [
            (
                "postgres://u@h/db?sslmode=disable&password=secret&application_name=x",
                "postgres://u@h/db?sslmode=disable&password=***&application_name=x",
            ),
            ("mysql://h/db?PASSWORD=secret", "mysql://h/db?PASSWORD=***"),
            (
                "host=db user=u password='a secret' dbname=pages",
                "host=db user=u password=*** dbname=pages",
            ),
            ("host=db sslpassword=secret", "host=db sslpassword=***"),
            ("redis://h/0?auth=secret;x=1", "redis://h/0?auth=***;x=1"),
            ("postgres://u@h/db?password=", "postgres://u@h/db?password="),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn scrub_hides_the_url_and_its_secrets_wherever_an_error_quotes_them() {
        let url = "postgres://u:s%40cret@h/db?sslpassword=other-secret";
        let text =
            format!("connect to {url}: password s@cret refused; tried s%40cret, then other-secret");
        let scrubbed = scrub_secrets(&text, url);
        for secret in ["s@cret", "s%40cret", "other-secret"] {
            assert!(!scrubbed.contains(secret), "{scrubbed}");
        }
        assert!(scrubbed.contains("postgres://u:***@h/db"), "{scrubbed}");
        assert_eq!(
            scrub_secrets("nothing secret", "redis://h:1"),
            "nothing secret"
        );
    }
}
