//! The protocol: what pelican writes to Redis and how it reads it back. Described for
//! people in `docs/PROTOCOL.md`; every key, value and script call is built here.
//!
//! - [`keys`]: every key of a queue.
//! - [`layout`]: where the partitions' tags put them in a cluster's slots, and the
//!   record of a queue's partitions.
//! - [`entry`]: request stream entries (and the RESP values they arrive in).
//! - [`head`]: an entry's `head` field, the request's own facts in one value.
//! - [`index`]: the value of a request's state key, `req:<rid>`.
//! - [`outcome`]: an outcome as it is stored and pushed.
//! - [`request_id`]: the rules a request id follows.
//! - [`scripts`]: the Lua scripts (`lua/*.lua`), one typed call per script.
//! - [`stored`]: values stored beside the stream (large bodies and answers).

pub(crate) mod entry;
pub(crate) mod head;
pub(crate) mod index;
pub(crate) mod keys;
pub(crate) mod layout;
pub(crate) mod outcome;
pub(crate) mod request_id;
pub(crate) mod scripts;
pub(crate) mod stored;
