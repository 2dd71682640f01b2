//! Request ids, producer ids and consumer names.

use std::cell::RefCell;

/// The dedup key of a body: the first 128 bits of its BLAKE3 hash, in hex. A
/// cryptographic hash, so a client cannot craft a request that collides with another's on
/// purpose; BLAKE3 rather than SHA-256 because a megabyte body costs 0.16 ms instead of
/// 0.56 ms (with the CPU's SHA extensions) on the producer, per submission.
pub(crate) fn request_id(body: &[u8]) -> String {
    let digest = blake3::hash(body);
    hex(&digest.as_bytes()[..16])
}

/// 128 random bits in hex (no `;`, so safe inside the request index), from the OS's
/// generator. Made per submission without dedup, so drawn [`POOL_BYTES`] at a time per
/// thread: one `getrandom` system call serves 256 ids. On the benchmark VM a call per id
/// took ~225 ns, the pool ~25 ns a draw (the SipHash of the clock it replaces, ~38 ns).
/// A process that forks without exec shares its parent's unused pool; nothing in
/// pelican forks.
pub(crate) fn random_id() -> String {
    thread_local! {
        static POOL: RefCell<Pool> = const { RefCell::new(Pool { bytes: [0; POOL_BYTES], used: POOL_BYTES }) };
    }
    POOL.with_borrow_mut(|pool| hex(pool.take()))
}

/// Bytes drawn from the OS at a time by [`random_id`].
const POOL_BYTES: usize = 4096;
/// Bytes per random id.
const ID_BYTES: usize = 16;

/// Random bytes of the OS, handed out [`ID_BYTES`] at a time, each once.
struct Pool {
    bytes: [u8; POOL_BYTES],
    used: usize,
}

impl Pool {
    fn take(&mut self) -> &[u8] {
        if self.used + ID_BYTES > POOL_BYTES {
            fill(&mut self.bytes);
            self.used = 0;
        }
        let id = &self.bytes[self.used..self.used + ID_BYTES];
        self.used += ID_BYTES;
        id
    }
}

/// Fills `buf` from the OS's generator. It fails only on a system without one, where
/// std's own hash maps cannot be seeded either (and panic as this does).
fn fill(buf: &mut [u8]) {
    getrandom::fill(buf).expect("the OS's random number generator failed");
}

/// A consumer name that says where it runs: `<host>-<pid>-<random>`.
pub(crate) fn consumer_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        .unwrap_or_else(|| "host".to_string());
    let mut random = [0u8; 4];
    fill(&mut random);
    format!("{host}-{}-{}", std::process::id(), hex(&random))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_stable_and_distinct() {
        assert_eq!(request_id(b"a"), request_id(b"a"));
        assert_ne!(request_id(b"a"), request_id(b"b"));
        assert_eq!(request_id(b"a").len(), 32);
        // BLAKE3("abc"), the reference implementation's test vector: 6437b3ac...
        assert_eq!(request_id(b"abc"), "6437b3ac38465133ffb63b75273a8db5");
    }

    fn is_hex(s: &str) -> bool {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }

    #[test]
    fn random_ids_differ() {
        // Many pools' worth, on two threads (a pool each).
        let other = std::thread::spawn(|| (0..5_000).map(|_| random_id()).collect::<Vec<_>>());
        let mut ids: std::collections::HashSet<String> = (0..10_000).map(|_| random_id()).collect();
        ids.extend(other.join().unwrap());
        assert_eq!(ids.len(), 15_000);
        assert!(
            ids.iter().all(|id| id.len() == 32 && is_hex(id)),
            "32 hex digits"
        );
    }

    #[test]
    fn consumer_names_say_where_they_run() {
        let (a, b) = (consumer_name(), consumer_name());
        assert_ne!(a, b);
        let pid = std::process::id().to_string();
        let parts: Vec<&str> = a.rsplitn(3, '-').collect();
        assert_eq!(parts[1], pid, "{a}");
        assert!(parts[0].len() == 8 && is_hex(parts[0]), "{a}");
        assert!(!parts[2].is_empty(), "{a}");
    }
}
