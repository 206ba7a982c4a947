//! URLs as they may appear in messages: without their passwords.

/// `url` without the secrets it may carry: the password of its userinfo
/// (`scheme://user:***@host`) and the value of every query parameter whose
/// name contains `password` (`?password=***`, `sslpassword=***`). Works on
/// multi-host URLs (`postgres://u:pw@h1,h2/db`,
/// `redis-sentinel://u:pw@s1,s2/master`) and on a bare `user:pw@host:port`.
///
/// When in doubt it hides more: everything between the scheme and the last
/// `@` is taken as userinfo.
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
    let start = url.find("://").map_or(0, |i| i + 3);
    let (head, rest) = url.split_at(start);
    let (rest, fragment) = match rest.find('#') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at..]),
        None => (None, rest),
    };
    let mut out = String::from(head);
    if let Some(userinfo) = userinfo {
        match userinfo.split_once(':') {
            Some((user, _)) => {
                out.push_str(user);
                out.push_str(":***");
            }
            None => out.push_str(userinfo),
        }
    }
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    out.push_str(path);
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.to_ascii_lowercase().contains("password") => {
                    format!("{key}=***")
                }
                _ => pair.to_string(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    out.push_str(fragment);
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_hidden_and_the_rest_is_kept() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            ("redis://w:pw@h:1/", "redis://w:***@h:1/"),
            ("redis://:pw@h:1", "redis://:***@h:1"),
            ("redis://user@h:1", "redis://user@h:1"),
            (
                "redis-sentinel://w:p%40w@s1:26379,s2:26379/mymaster",
                "redis-sentinel://w:***@s1:26379,s2:26379/mymaster",
            ),
            ("postgres://u:a@b@h1,h2/db", "postgres://u:***@h1,h2/db"),
            ("w:pw@s1:26379", "w:***@s1:26379"),
            (
                "postgres://u@h/db?sslmode=disable&password=x&SSLPassword=y",
                "postgres://u@h/db?sslmode=disable&password=***&SSLPassword=***",
            ),
            ("x://h/p?password", "x://h/p?password"),
            ("x://u:pw@h/p#frag@x", "x://u:***@h/p#frag@x"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
