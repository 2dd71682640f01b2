//! Request ids: the dedup key of a request, and a part of key names (its index, its
//! outcome), whoever chose it (a producer's hash of the body, or its caller).

use crate::error::{Error, Result};

/// Longest accepted caller-chosen request id.
pub const MAX_REQUEST_ID_LEN: usize = 256;

/// Checks a caller-chosen request id.
pub(crate) fn validate_request_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_REQUEST_ID_LEN {
        return Err(Error::config(format!(
            "a request id must be 1 to {MAX_REQUEST_ID_LEN} bytes long, got {}",
            id.len()
        )));
    }
    // Printable ASCII throughout (every id pelican makes) needs no look at its chars.
    let printable = id.bytes().all(|b| (0x20..0x7f).contains(&b));
    if !printable && id.chars().any(|c| c.is_control()) {
        return Err(Error::config(format!(
            "the request id {id:?} contains a control character"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Control characters are refused in ASCII and beyond it alike; anything else
    /// printable, of any script, is an id.
    #[test]
    fn a_request_id_has_no_control_characters() {
        for good in [
            "a",
            "job-42:x/y",
            "caf\u{e9}",
            "\u{1F426}",
            &"x".repeat(MAX_REQUEST_ID_LEN),
        ] {
            assert!(validate_request_id(good).is_ok(), "{good:?}");
        }
        let long = "x".repeat(MAX_REQUEST_ID_LEN + 1);
        for bad in ["", "a\nb", "\u{7f}", "tab\t", "a\u{85}b", "\u{9f}", &long] {
            assert!(validate_request_id(bad).is_err(), "{bad:?}");
        }
    }
}
