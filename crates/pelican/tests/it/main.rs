//! Integration tests: every test starts its own redis-server (pelican-testkit).

mod common;
mod smoke;
