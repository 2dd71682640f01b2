//! Small formatting helpers for human-readable output.

use std::time::{SystemTime, UNIX_EPOCH};

/// A duration given in milliseconds, in the unit that reads best: `0.8 ms`, `41 ms`,
/// `1.42 s`, `3m05s`.
pub fn duration_ms(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if ms < 60_000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        let s = (ms / 1000.0).round() as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// A point in time (ms since the epoch) relative to now: `in 4m59s`, `12.0 s ago`.
pub fn age(epoch_ms: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    if epoch_ms >= now {
        format!("in {}", duration_ms((epoch_ms - now) as f64))
    } else {
        format!("{} ago", duration_ms((now - epoch_ms) as f64))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_well() {
        assert_eq!(super::duration_ms(0.84), "0.8 ms");
        assert_eq!(super::duration_ms(41.2), "41 ms");
        assert_eq!(super::duration_ms(1420.0), "1.42 s");
        assert_eq!(super::duration_ms(185_000.0), "3m05s");
    }
}
