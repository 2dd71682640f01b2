//! A Redis URL as the command holds it. It may carry a password, so its `Debug` shows it
//! redacted, and it has no `Display`: a message says `.redacted()`, a connection or a
//! child's command line says `.as_str()`.

use pelican::admin::redacted_url;
use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

/// A Redis URL, possibly with credentials. Not validated here: `QueueConfig::validate`
/// (or the connection) says what is wrong with it.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL as given, password included: for connecting and for child processes.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The URL without its password, for messages.
    pub fn redacted(&self) -> String {
        redacted_url(&self.0)
    }
}

impl FromStr for RedisUrl {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<Self, Infallible> {
        Ok(RedisUrl(s.to_string()))
    }
}

impl From<String> for RedisUrl {
    fn from(url: String) -> Self {
        RedisUrl(url)
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisUrl").field(&self.redacted()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_password() {
        let url: RedisUrl = "redis://app:hunter2@db:6379/0".parse().unwrap();
        let shown = format!("{url:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redis://app:***@db:6379/0"), "{shown}");
        assert_eq!(url.as_str(), "redis://app:hunter2@db:6379/0");
    }
}
