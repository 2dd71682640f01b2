//! One test (or a few) per invariant of DESIGN.md, a file per invariant (or two); invariant
//! 5 is in `lease`, 7 in `garbage`, 9 in `faults`.

use std::time::Duration;

mod dedup;
mod memory;
mod outcomes;
mod recovery;
mod shutdown;

/// Slack on top of a configured time before a test calls it a hang: the suite runs
/// tests in parallel on two cores.
const SLACK: Duration = Duration::from_secs(3);
