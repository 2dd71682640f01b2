//! What the command's HTTP surfaces share (the dashboard, the gateway), so a rule is
//! written once and both keep it:
//!
//! - `error`: the one error answer, `{"error": {"kind": ..., "message": ...}}`, with a
//!   status per kind; library and Redis errors mapped to it (503 only when Redis cannot
//!   be reached).
//! - `fallback`: the errors the HTTP stack answers by itself (wrong method, a path that
//!   is not UTF-8, no such route) in that shape too.
//! - `policy`: loopback and the `Host` check, the token, sessions, constant-time
//!   comparison.
//! - `parse`: strict parsing of what a request carries (Host, stream ids, numbers).

pub mod error;
pub mod fallback;
pub mod parse;
pub mod policy;

pub use error::{ApiError, Kind};
pub use policy::Policy;
