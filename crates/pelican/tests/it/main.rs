//! Integration tests: every test starts its own redis-server (pelican-testkit).
//!
//! - `smoke`: a round trip, dedup + crash + dead letter in one go.
//! - `cluster`: queues over a Redis Cluster.
//! - `matrix`: the seed system's scenario matrix, one scenario run in many modes.
//! - `invariants`: one test (or a few) per invariant of DESIGN.md.
//! - `large`: large and raw bodies, stored beside the stream, up to 16 MiB.
//! - `lease`: invariant 5, leases kept and lost.
//! - `garbage`: invariant 7, entries written by broken or foreign clients.
//! - `foreign`: invariant 7, queue keys a foreign client wrote (another type, junk).
//! - `processes`: dedup across producers in two OS processes.
//! - `faults`: dropped connections.
//! - `failover`: a cluster master killed mid-run, its replica promoted.
//! - `refusals`: which Redis errors a caller may retry.
//! - `nitro`: Nitro's wire format against a raw client of it (see `nitro/mod.rs`; with
//!   the `nitro` feature).
//! - `serve`: `Consumer::serve`'s handler tasks: the concurrency bound, every way a handler ends.
//! - `supervision`: panicking tasks surface as errors; a dropped consumer writes what it was given.
//! - `sweep`: the producer's sweep of requests without dedup: the lost submitted again.
//! - `trace`: the entry's trace context field `tp`.
//! - `wake`: released work taken again at once, a stop at once, whatever `block` is.
//! - `docs`: the repository's documents agree with the package (README examples, entry
//!   fields in docs/PROTOCOL.md, licence copies).
//! - `per_call`: options of one call, detached tickets, watching a request by its id.

mod cluster;
mod common;
mod docs;
mod failover;
mod faults;
mod foreign;
mod garbage;
mod invariants;
mod large;
mod layout;
mod lease;
mod matrix;
#[cfg(feature = "nitro")]
mod nitro;
mod per_call;
mod processes;
mod read_ahead;
mod refusals;
mod serve;
mod smoke;
mod supervision;
mod sweep;
mod trace;
mod wake;
