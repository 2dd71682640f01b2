//! The fault-injection suite (issue #5): real `pelican worker` processes, real
//! redis-server processes, this test process as the producer. Each scenario injects one
//! kind of fault under load, accounts for every caller (answered once with its own
//! response, or a typed error where the fault allows one; never hung) and ends with the
//! memory check. Each prints one summary line, `RELIABILITY {json}`, also appended to
//! `target/tmp/reliability.jsonl`; RELIABILITY.md's table comes from those lines.
//!
//! Short variants run in CI; `PELICAN_SOAK=1` runs the long ones instead (never a
//! silent skip: without it the short variant runs). Scenarios run one at a time
//! (`common::serial`), each against its own redis-server.
//!
//! - `kills`: workers SIGKILLed at random moments under load.
//! - `restart`: Redis restarted mid-run, with and without persistence.
//! - `proxy`: connections cut, blackholed and slowed through a TCP proxy.
//! - `poison`: crash-if requests among normal ones.
//! - `hostile`: a foreign client writing garbage to the queue's keys.
//! - `slow`: handlers slower than claim_idle under load.
//! - `cluster`: a queue over a Redis Cluster: reshardings (slots moved, some held half
//!   moved while a worker is killed) and masters killed, with worker processes.
//! - `chaos`: the chaos soak on a Redis Cluster with replicas: masters SIGKILLed and
//!   SIGSTOPped, workers SIGKILLed, slots moved at random under load from several
//!   producers, on the lean and the client library's connections.
//! - `acl_tls`: the core scenario as a least-privilege ACL user, and over TLS.
//! - `memory`: memory under steady load, and the soak's figures (every scenario ends
//!   with the short check).
//! - `regressions`: one focused test per bug the scenarios found.

mod checks;
mod common;
mod fleet;
mod load;
mod spy;

mod acl_tls;
mod chaos;
mod cluster;
mod hostile;
mod kills;
mod memory;
mod poison;
mod proxy;
mod regressions;
mod restart;
mod slow;
