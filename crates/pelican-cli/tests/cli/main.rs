//! Integration tests of the `pelican` binary: each test runs the built binary against
//! its own redis-server (pelican-testkit), never a shared one.

mod support;

mod bench;
mod cluster;
mod dashboard;
mod dead;
mod demo;
mod exit_codes;
mod external;
mod gateway;
mod gateway_async;
mod gateway_errors;
mod gateway_examples;
mod gateway_load;
mod inspect;
mod logs;
mod metrics;
mod nitro;
mod round_trip;
mod signals;
mod stats;
#[cfg(feature = "otel")]
mod trace;
