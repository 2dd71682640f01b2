//! Every Redis key of a Nitro stream is built here: Nitro's own (the stream, the answer
//! keys) and pelican's dedup state.
//!
//! Nitro's keys carry no hash tag. pelican's dedup keys carry `{<stream>}`: a key whose
//! hash tag is the whole stream name hashes to the stream's own slot, so the dedup
//! scripts (which touch the stream and these keys) stay in one slot.

/// The Redis keys of one Nitro stream, for tools and tests that look at Redis directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamKeys {
    pub(crate) stream: String,
    /// `result-key:<stream>.`: a result key is this plus the entry id.
    pub(crate) result_prefix: String,
    /// `error-key:<stream>.`: an error key is this plus the entry id plus `.error`.
    pub(crate) error_prefix: String,
    /// `pelican-nitro:{<stream>}:job:`: a dedup job is this plus the body hash.
    pub(crate) job_prefix: String,
    /// `pelican-nitro:{<stream>}:done:`: a cached answer is this plus the body hash.
    pub(crate) cache_prefix: String,
}

impl StreamKeys {
    /// The keys of stream `stream`.
    pub fn new(stream: &str) -> StreamKeys {
        StreamKeys {
            stream: stream.to_string(),
            result_prefix: format!("result-key:{stream}."),
            error_prefix: format!("error-key:{stream}."),
            job_prefix: format!("pelican-nitro:{{{stream}}}:job:"),
            cache_prefix: format!("pelican-nitro:{{{stream}}}:done:"),
        }
    }

    /// The stream (its consumer group has the same name).
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The consumer group: named like the stream.
    pub fn group(&self) -> &str {
        &self.stream
    }

    /// `result-key:<stream>.<id>`: the JSON response to entry `id`.
    pub fn result(&self, id: &str) -> String {
        format!("{}{id}", self.result_prefix)
    }

    /// `error-key:<stream>.<id>.error`: the error text for entry `id`.
    pub fn error(&self, id: &str) -> String {
        format!("{}{id}.error", self.error_prefix)
    }

    /// The dedup job of a body hash (which entry solves it, which wait for it).
    pub fn job(&self, hash: &str) -> String {
        format!("{}{hash}", self.job_prefix)
    }

    /// The cached answer of a body hash.
    pub fn cached(&self, hash: &str) -> String {
        format!("{}{hash}", self.cache_prefix)
    }

    /// SCAN patterns for the result keys, the error keys, the dedup jobs and the cached
    /// answers (glob characters of the stream name escaped).
    pub(crate) fn patterns(&self) -> [String; 4] {
        [
            format!("{}*", glob_escape(&self.result_prefix)),
            format!("{}*.error", glob_escape(&self.error_prefix)),
            format!("{}*", glob_escape(&self.job_prefix)),
            format!("{}*", glob_escape(&self.cache_prefix)),
        ]
    }
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_nitros() {
        let k = StreamKeys::new("selftest-d");
        assert_eq!(
            k.result("1796067314245-0"),
            "result-key:selftest-d.1796067314245-0"
        );
        assert_eq!(
            k.error("1796067352602-0"),
            "error-key:selftest-d.1796067352602-0.error"
        );
        assert_eq!(k.group(), "selftest-d");
        assert_eq!(k.job("ab"), "pelican-nitro:{selftest-d}:job:ab");
        assert_eq!(k.patterns()[0], "result-key:selftest-d.*");
        assert_eq!(
            StreamKeys::new("a*b").patterns()[1],
            "error-key:a\\*b.*.error"
        );
    }

    /// A key whose hash tag is the whole stream name lands in the stream's slot.
    #[test]
    fn dedup_keys_share_the_streams_slot() {
        let k = StreamKeys::new("stream:0x8b10");
        let tag = &k.job("x")["pelican-nitro:{".len()..];
        assert!(tag.starts_with("stream:0x8b10}"), "{tag}");
    }
}
