//! [`Token`]: the fencing token, one type for the lock library, the worker and
//! the gateway.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A fencing token: a number minted in the same atomic step as a lock grant,
/// larger than every token the same issuer minted before for the same lock.
///
/// Tokens of one issuer are comparable with each other (`<`, `max`), and only
/// with each other: a Redis token 7 and a ZooKeeper token 7 say nothing about
/// one another. Which issuer minted a token travels beside it (the lease's
/// [`issuer`](crate::Lease::issuer), the gateway's `Fencing-Issuer` header).
///
/// Every backend's counter fits in 63 bits (Redis `INCR` and SQL `bigint` are
/// signed 64-bit, a ZooKeeper zxid is a signed `long`), so a token is at most
/// [`Token::MAX`] = `i64::MAX`; storage can keep it in a `bigint` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Token(u64);

impl Token {
    /// The smallest token.
    pub const MIN: Token = Token(0);

    /// The largest token any backend can mint (`i64::MAX`).
    pub const MAX: Token = Token(i64::MAX as u64);

    /// The token `n`, or `None` above [`Token::MAX`].
    pub const fn new(n: u64) -> Option<Token> {
        if n <= i64::MAX as u64 {
            Some(Token(n))
        } else {
            None
        }
    }

    /// The token as an unsigned number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The token as a signed 64-bit number (for `bigint` columns): always
    /// non-negative.
    pub const fn to_i64(self) -> i64 {
        self.0 as i64
    }
}

impl TryFrom<i64> for Token {
    type Error = TokenError;

    fn try_from(n: i64) -> Result<Token, TokenError> {
        u64::try_from(n)
            .ok()
            .and_then(Token::new)
            .ok_or(TokenError::OutOfRange)
    }
}

impl TryFrom<u64> for Token {
    type Error = TokenError;

    fn try_from(n: u64) -> Result<Token, TokenError> {
        Token::new(n).ok_or(TokenError::OutOfRange)
    }
}

impl From<Token> for u64 {
    fn from(t: Token) -> u64 {
        t.0
    }
}

impl From<Token> for i64 {
    fn from(t: Token) -> i64 {
        t.to_i64()
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Why a text or number is not a [`Token`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Not plain decimal digits (no sign, no spaces, not empty).
    #[error("a fencing token is plain decimal digits")]
    NotDecimal,
    /// Negative, or above `i64::MAX`.
    #[error("a fencing token is from 0 to {}", i64::MAX)]
    OutOfRange,
}

impl FromStr for Token {
    type Err = TokenError;

    /// Plain decimal digits, `0` to `i64::MAX`: no sign, no spaces, no
    /// exponent. What the gateway accepts in `Fencing-Token`.
    fn from_str(s: &str) -> Result<Token, TokenError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(TokenError::NotDecimal);
        }
        s.parse::<u64>()
            .ok()
            .and_then(Token::new)
            .ok_or(TokenError::OutOfRange)
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Token, D::Error> {
        let n = u64::deserialize(d)?;
        Token::new(n).ok_or_else(|| serde::de::Error::custom(TokenError::OutOfRange))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_plain_decimal_within_i64() {
        assert_eq!("0".parse(), Ok(Token(0)));
        assert_eq!("9223372036854775807".parse(), Ok(Token::MAX));
        assert_eq!(
            "9223372036854775808".parse::<Token>(),
            Err(TokenError::OutOfRange)
        );
        for bad in ["-1", "+1", "1e3", "", " 1", "0x10"] {
            assert_eq!(bad.parse::<Token>(), Err(TokenError::NotDecimal), "{bad:?}");
        }
    }

    #[test]
    fn conversions_keep_the_range() {
        assert_eq!(Token::try_from(-1i64), Err(TokenError::OutOfRange));
        assert_eq!(Token::try_from(i64::MAX), Ok(Token::MAX));
        assert_eq!(Token::try_from(u64::MAX), Err(TokenError::OutOfRange));
        assert_eq!(Token::new(33).unwrap().to_i64(), 33);
        assert!(Token::new(33) < Token::new(34));
    }

    #[test]
    fn serde_is_a_plain_number() {
        assert_eq!(serde_json::to_string(&Token(33)).unwrap(), "33");
        assert_eq!(serde_json::from_str::<Token>("34").unwrap(), Token(34));
        assert!(serde_json::from_str::<Token>("9223372036854775808").is_err());
        assert!(serde_json::from_str::<Token>("-1").is_err());
    }
}
