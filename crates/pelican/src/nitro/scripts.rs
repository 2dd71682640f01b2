//! The Lua scripts of the Nitro format (`lua/nitro_*.lua`), one operation per file;
//! `nitro_lib.lua` holds their shared helpers and is prepended to each.

use redis::Script;

const LIB: &str = include_str!("../../lua/nitro_lib.lua");

fn with_lib(body: &str) -> Script {
    Script::new(&format!("{LIB}\n{body}"))
}

/// Every script a Nitro-format consumer or producer uses, hashed once per connect.
pub(crate) struct Scripts {
    pub(crate) answer: Script,
    pub(crate) join: Script,
    pub(crate) renew: Script,
    pub(crate) release: Script,
    pub(crate) reclaim: Script,
    pub(crate) gc: Script,
    pub(crate) trim: Script,
    pub(crate) verify: Script,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            answer: with_lib(include_str!("../../lua/nitro_answer.lua")),
            join: with_lib(include_str!("../../lua/nitro_join.lua")),
            renew: with_lib(include_str!("../../lua/nitro_renew.lua")),
            release: with_lib(include_str!("../../lua/nitro_release.lua")),
            reclaim: Script::new(include_str!("../../lua/nitro_reclaim.lua")),
            gc: Script::new(include_str!("../../lua/nitro_gc.lua")),
            trim: Script::new(include_str!("../../lua/nitro_trim.lua")),
            verify: Script::new(include_str!("../../lua/nitro_verify.lua")),
        }
    }
}
