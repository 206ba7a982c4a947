//! Digest credentials: a user and its password (what a session
//! authenticates with), the id an ACL names the user by, and the
//! `zookeeper://user:password@hosts/` URL that carries them.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use sha1::{Digest, Sha1};
use zookeeper_client as zk;

use crate::LockError;

/// A digest user and its password: what a session authenticates with.
/// Its `Debug` shows the user only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: String,
}

impl Credentials {
    /// `user` (not empty, no `:`) and `password` (not empty).
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Result<Self, LockError> {
        let (user, password) = (user.into(), password.into());
        check_user(&user)?;
        if password.is_empty() {
            return Err(LockError::InvalidConfig(format!(
                "zookeeper user {user:?}: the password is empty"
            )));
        }
        Ok(Self { user, password })
    }

    pub fn user(&self) -> &str {
        &self.user
    }

    /// How ACLs name this user.
    pub fn id(&self) -> DigestId {
        let digest = Sha1::digest(self.auth());
        DigestId(format!("{}:{}", self.user, BASE64.encode(digest)))
    }

    /// The digest scheme's auth packet: `user:password`.
    pub(super) fn auth(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password).into_bytes()
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials({}:***)", self.user)
    }
}

/// `user:password` (the password may hold `:`). Errors never show it.
impl FromStr for Credentials {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self, LockError> {
        match s.split_once(':') {
            Some((user, password)) => Self::new(user, password),
            None => Err(LockError::InvalidConfig(
                "zookeeper credentials: expected user:password".into(),
            )),
        }
    }
}

fn check_user(user: &str) -> Result<(), LockError> {
    if user.is_empty() || user.contains(':') || user.chars().any(char::is_whitespace) {
        return Err(LockError::InvalidConfig(format!(
            "zookeeper user {user:?}: must be non-empty, without ':' or spaces"
        )));
    }
    Ok(())
}

/// How an ACL names a digest user: `user:base64(sha1(user:password))`.
/// Not a secret: lock clients name the gateway's and the admin's this way
/// without knowing their passwords.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DigestId(String);

impl DigestId {
    pub fn user(&self) -> &str {
        self.0.split_once(':').map_or(&*self.0, |(user, _)| user)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(super) fn acl(&self, rights: zk::Permission) -> zk::Acl {
        zk::Acl::new(rights, zk::AuthId::new("digest", &self.0))
    }
}

impl fmt::Display for DigestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for DigestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DigestId({})", self.0)
    }
}

/// `user:<base64 of a 20-byte SHA-1>`, as [`Credentials::id`] writes it.
impl FromStr for DigestId {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self, LockError> {
        let bad = || {
            LockError::InvalidConfig(format!(
                "zookeeper digest id {s:?}: expected user:base64(sha1(user:password))"
            ))
        };
        let (user, hash) = s.trim().split_once(':').ok_or_else(bad)?;
        check_user(user)?;
        match BASE64.decode(hash) {
            Ok(digest) if digest.len() == 20 => Ok(Self(format!("{user}:{hash}"))),
            _ => Err(bad()),
        }
    }
}

/// `zookeeper://[user:password@]host:port[,host:port...][/]` (or `zk://`):
/// the connect string and the credentials, percent-decoded. Errors never
/// show the password.
pub fn parse_url(url: &str) -> Result<(String, Option<Credentials>), LockError> {
    let rest = url
        .split_once("://")
        .filter(|(scheme, _)| matches!(&*scheme.to_ascii_lowercase(), "zookeeper" | "zk"))
        .map(|(_, rest)| rest)
        .ok_or_else(|| {
            LockError::InvalidConfig("a zookeeper URL starts with zookeeper:// or zk://".into())
        })?;
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, rest),
    };
    let hosts = hosts.trim_end_matches('/').to_string();
    if hosts.split(',').all(|h| h.trim().is_empty()) {
        return Err(LockError::InvalidConfig(
            "zookeeper://host:port[,host:port...] names no server".into(),
        ));
    }
    let credentials = match userinfo {
        None => None,
        Some(userinfo) => {
            let (user, password) = userinfo.split_once(':').ok_or_else(|| {
                LockError::InvalidConfig(
                    "zookeeper URL: the user needs a password (user:password@)".into(),
                )
            })?;
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8()
                    .map(|d| d.into_owned())
                    .map_err(|_| {
                        LockError::InvalidConfig(
                            "zookeeper URL: the credentials are not UTF-8 once decoded".into(),
                        )
                    })
            };
            Some(Credentials::new(decode(user)?, decode(password)?)?)
        }
    };
    Ok((hosts, credentials))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `user:password` parsed (the ACL tests use it too).
    pub(in crate::zookeeper) fn creds(s: &str) -> Credentials {
        s.parse().unwrap()
    }

    #[test]
    fn digest_ids_are_what_zookeeper_computes() {
        // `printf 'admin:secret' | openssl sha1 -binary | base64`
        let id = creds("admin:secret").id();
        assert_eq!(id.as_str(), "admin:fvr2cB/fjGeAiX8g1aGhUm3ZICk=");
        assert_eq!(id.user(), "admin");
        assert_eq!(id.as_str().parse::<DigestId>().unwrap(), id);
        // The password may hold a colon; the user may not.
        assert_eq!(creds("u:a:b").user(), "u");
        for bad in ["", "user", ":pw", "user:", "a b:pw"] {
            assert!(bad.parse::<Credentials>().is_err(), "{bad:?}");
        }
        for bad in [
            "admin",
            "admin:secret",
            "admin:AAAA",
            ":fvr2cB/fjGeAiX8g1aGhUm3ZICk=",
        ] {
            assert!(bad.parse::<DigestId>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn passwords_never_show() {
        let c = creds("worker-1:hunter2");
        assert!(!format!("{c:?}").contains("hunter2"));
        let e = "worker-1:".parse::<Credentials>().unwrap_err();
        assert!(!e.to_string().contains("hunter2"));
        for bad in [
            "zookeeper://gw:hunter2@/",
            "zookeeper://g w:hunter2@h:2181/",
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn urls_give_the_hosts_and_the_decoded_credentials() {
        let (hosts, c) = parse_url("zookeeper://gw:p%40ss%3Aword@h1:2181,h2:2181/").unwrap();
        assert_eq!(hosts, "h1:2181,h2:2181");
        let c = c.unwrap();
        assert_eq!(c.user(), "gw");
        assert_eq!(c, Credentials::new("gw", "p@ss:word").unwrap());
        assert_eq!(parse_url("zk://h1:2181").unwrap(), ("h1:2181".into(), None));
        for bad in ["zookeeper:///", "zookeeper://gw@h1:2181", "redis://h1:6379"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
