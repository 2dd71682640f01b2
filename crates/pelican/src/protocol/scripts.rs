//! The Lua scripts, one operation per file in `lua/`. Each multi-key transition is one
//! script: atomic and one round trip. `lib.lua` holds the helpers they share and is
//! prepended to the scripts that use it.

use redis::Script;

const LIB: &str = include_str!("../../lua/lib.lua");

fn with_lib(body: &str) -> Script {
    Script::new(&format!("{LIB}\n{body}"))
}

/// Every script a queue uses, hashed once per producer or consumer.
pub(crate) struct Scripts {
    pub(crate) submit: Script,
    pub(crate) complete: Script,
    pub(crate) reclaim: Script,
    pub(crate) renew: Script,
    pub(crate) release: Script,
    pub(crate) reject: Script,
    pub(crate) cancel: Script,
    pub(crate) janitor: Script,
    pub(crate) requeue: Script,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            submit: with_lib(include_str!("../../lua/submit.lua")),
            complete: with_lib(include_str!("../../lua/complete.lua")),
            reclaim: with_lib(include_str!("../../lua/reclaim.lua")),
            renew: Script::new(include_str!("../../lua/renew.lua")),
            release: Script::new(include_str!("../../lua/release.lua")),
            reject: with_lib(include_str!("../../lua/reject.lua")),
            cancel: Script::new(include_str!("../../lua/cancel.lua")),
            janitor: with_lib(include_str!("../../lua/janitor.lua")),
            requeue: with_lib(include_str!("../../lua/requeue.lua")),
        }
    }
}
