//! Integration tests: every test starts its own redis-server (pelican-testkit).
//!
//! - `smoke`: a round trip, dedup + crash + dead letter in one go.
//! - `matrix`: the seed system's scenario matrix, one scenario run in many modes.
//! - `invariants`: one test (or a few) per invariant of DESIGN.md.
//! - `lease`: invariant 5, leases kept and lost.
//! - `garbage`: invariant 7, entries written by broken or foreign clients.
//! - `processes`: dedup across producers in two OS processes.
//! - `faults`: dropped connections.
//! - `refusals`: which Redis errors a caller may retry.
//! - `nitro`: Nitro's wire format against a raw client of it (see `nitro/mod.rs`).
//! - `supervision`: panicking tasks surface as errors; a dropped consumer writes what it was given.

mod common;
mod faults;
mod garbage;
mod invariants;
mod lease;
mod matrix;
mod nitro;
mod processes;
mod refusals;
mod smoke;
mod supervision;
