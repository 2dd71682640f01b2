//! Latencies without keeping every sample: a log-linear histogram of nanoseconds whose
//! buckets are at most 1/1024 of their value wide (0.1 %), so a run of a million
//! requests costs the same memory as a run of a thousand (the memory-flatness check
//! measures the producer's RSS across run lengths, so the bench must not grow either).

use std::time::Duration;

/// Values below `2^SUB_BITS` ns have a bucket each; above, each power of two is split
/// into `2^(SUB_BITS-1)` buckets.
const SUB_BITS: u32 = 11;
const HALF: usize = 1 << (SUB_BITS - 1);
/// Buckets for every u64: the largest value has 64 bits, shift 53.
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * HALF + HALF;

/// Counts of latencies, with exact count, sum and maximum.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    n: u64,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            n: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

fn index(v: u64) -> usize {
    let bits = 64 - v.leading_zeros();
    if bits <= SUB_BITS {
        v as usize
    } else {
        let shift = bits - SUB_BITS;
        (shift as usize) * HALF + (v >> shift) as usize
    }
}

/// The smallest value of bucket `i`.
fn lower_bound(i: usize) -> u64 {
    if i < 2 * HALF {
        i as u64
    } else {
        let shift = i / HALF - 1;
        ((i - shift * HALF) as u64) << shift
    }
}

impl Histogram {
    /// Adds one latency.
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[index(ns)] += 1;
        self.n += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// The q-quantile (0..=1) by nearest rank, in ms (the lower edge of its bucket: at
    /// most 0.1 % below the sample); 0 when empty.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                // the top bucket holds the maximum: report it exactly
                let v = if seen == self.n {
                    self.max_ns
                } else {
                    lower_bound(i)
                };
                return v as f64 / 1e6;
            }
        }
        self.max_ns as f64 / 1e6
    }

    /// The largest latency, ms.
    pub fn max_ms(&self) -> f64 {
        self.max_ns as f64 / 1e6
    }

    /// The mean latency, ms.
    pub fn mean_ms(&self) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        (self.sum_ns / u128::from(self.n)) as f64 / 1e6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_narrow() {
        let mut last = 0;
        for v in (0..5_000u64).chain((1..60).map(|s| (1u64 << s) + 12_345)) {
            let i = index(v);
            assert!(i >= last, "index must not decrease at {v}");
            last = i;
            let lo = lower_bound(i);
            assert!(lo <= v, "{v}: bucket {i} starts at {lo}");
            assert!(
                v - lo <= v / 1024,
                "{v}: bucket {i} starts at {lo}: too wide"
            );
            assert_eq!(index(lo), i, "{v}");
        }
        assert!(index(u64::MAX) < BUCKETS);
        for i in 0..BUCKETS - 1 {
            assert!(lower_bound(i) < lower_bound(i + 1), "bucket {i}");
        }
    }

    #[test]
    fn quantiles_use_nearest_rank() {
        let mut h = Histogram::default();
        for us in 1..=100u64 {
            h.record(Duration::from_micros(us));
        }
        assert_eq!(h.n, 100);
        let close = |got: f64, want_us: f64| (got * 1000.0 - want_us).abs() <= want_us / 1000.0;
        assert!(close(h.quantile_ms(0.5), 50.0), "{}", h.quantile_ms(0.5));
        assert!(close(h.quantile_ms(0.99), 99.0), "{}", h.quantile_ms(0.99));
        assert_eq!(h.quantile_ms(1.0), 0.1);
        assert_eq!(h.max_ms(), 0.1);
        assert!((h.mean_ms() - 0.0505).abs() < 1e-9);
        assert_eq!(Histogram::default().quantile_ms(0.5), 0.0);
    }
}
