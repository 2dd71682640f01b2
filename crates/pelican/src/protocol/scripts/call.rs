//! [`ScriptCall`]: one script call, built once, and the ways to run it (the shared
//! connection, a task's own, after other commands in one write, or by hand).

use super::library::{self, Function};
use super::unexpected;
use crate::conn::command::Command;
use crate::conn::wire::into_result;
use crate::conn::OwnConn;
use redis::{Cmd, RedisResult, Script, ToRedisArgs, Value};

/// One script call, built once: `FCALL` of a function of pelican's library (or, for the
/// Nitro format's scripts, `EVALSHA`) with its keys and arguments, and how its reply is
/// read. A retry sends the same command again. Encoded as it is built ([`Command`]): on
/// a lean connection those bytes are what is sent; the client library's connections get
/// its own command, made from them.
#[must_use]
pub(crate) struct ScriptCall<'s, R> {
    script: Lua<'s>,
    cmd: Command,
    reply: fn(Value) -> RedisResult<R>,
}

/// What a call runs, and so what is loaded when the server does not have it.
#[derive(Clone, Copy)]
enum Lua<'s> {
    /// A function of pelican's library.
    Function,
    /// A script of its own (the Nitro format's).
    #[cfg_attr(not(feature = "nitro"), allow(dead_code))]
    Script(&'s Script),
}

impl<'s, R> ScriptCall<'s, R> {
    /// A call of `function` of pelican's library.
    pub(crate) fn new(
        function: &'s Function,
        keys: &[&str],
        reply: fn(Value) -> RedisResult<R>,
    ) -> Self {
        let mut cmd = Command::new(&[b"FCALL", function.name.as_bytes()]);
        cmd.arg(keys.len()).arg(keys);
        ScriptCall {
            script: Lua::Function,
            cmd,
            reply,
        }
    }

    /// A call of `script`, sent with `EVALSHA` (the Nitro format's scripts).
    #[cfg(feature = "nitro")]
    pub(crate) fn script(
        script: &'s Script,
        keys: &[&str],
        reply: fn(Value) -> RedisResult<R>,
    ) -> Self {
        let mut cmd = Command::new(&[b"EVALSHA", script.get_hash().as_bytes()]);
        cmd.arg(keys.len()).arg(keys);
        ScriptCall {
            script: Lua::Script(script),
            cmd,
            reply,
        }
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Runs it on the shared connection, and when Redis does not have what it calls (a
    /// restart, a `FUNCTION FLUSH`) loads that and sends it again.
    pub(crate) async fn invoke(
        &self,
        conn: &mut (impl redis::aio::ConnectionLike + Send),
    ) -> RedisResult<R> {
        let cmd = self.cmd.to_cmd();
        let v = match cmd.query_async(conn).await {
            Err(e) if library::not_loaded(&e) => {
                self.load(conn).await?;
                cmd.query_async(conn).await?
            }
            r => r.map_err(library::explain)?,
        };
        (self.reply)(v)
    }

    /// The command as sent (RESP), for a write assembled by hand.
    pub(crate) fn packed(&self) -> Vec<u8> {
        self.cmd.packed()
    }

    /// Loads what it calls (after a reply that says the server does not have it,
    /// [`library::not_loaded`]): pelican's library, or its script.
    pub(crate) async fn load(
        &self,
        conn: &mut (impl redis::aio::ConnectionLike + Send),
    ) -> RedisResult<()> {
        match self.script {
            Lua::Function => library::load(conn).await,
            Lua::Script(script) => script.load_async(conn).await.map(drop),
        }
    }

    /// A pipeline of `before` (commands whose replies are not needed, e.g. the SETs of
    /// stored bodies) and then this call, all sent in one write: run it with
    /// [`ScriptCall::invoke_pipeline`]. The commands are moved, not copied.
    pub(crate) fn after(&self, before: Vec<Cmd>) -> redis::Pipeline {
        let mut p = redis::pipe();
        p.ignore_errors();
        for c in before {
            p.add_command(c);
        }
        p.add_command(self.cmd.to_cmd());
        p
    }

    /// Runs a pipeline made by [`ScriptCall::after`] and reads this call's reply. The
    /// commands before it are not checked: the script sees what they did (or did not do).
    /// When Redis does not have what it calls, that is loaded and the whole pipeline sent
    /// again (the commands before must be idempotent).
    pub(crate) async fn invoke_pipeline(
        &self,
        pipe: &redis::Pipeline,
        conn: &mut (impl redis::aio::ConnectionLike + Send),
    ) -> RedisResult<R> {
        let mut loaded = false;
        loop {
            let mut replies: Vec<RedisResult<Value>> = pipe.query_async(conn).await?;
            let last = replies
                .pop()
                .ok_or_else(|| unexpected("an empty pipeline reply", &Value::Nil))?;
            match self.reply_or_reload(last, loaded) {
                Some(r) => return r,
                None => {
                    self.load(conn).await?;
                    loaded = true;
                }
            }
        }
    }

    /// This call's reply, read from `last` (what Redis answered to it), or `None` when
    /// Redis did not have what it calls: that is to be loaded and the call sent again,
    /// once (`loaded`: it was already).
    pub(crate) fn reply_or_reload(
        &self,
        last: RedisResult<Value>,
        loaded: bool,
    ) -> Option<RedisResult<R>> {
        match last {
            Err(e) if library::not_loaded(&e) && !loaded => None,
            r => Some(r.map_err(library::explain).and_then(self.reply)),
        }
    }

    /// Runs it on a lean connection, loading what it calls through `loader` when Redis
    /// does not have it.
    async fn invoke_lean(
        &self,
        c: &mut crate::conn::wire::LeanConn,
        loader: &mut crate::conn::Conn,
    ) -> RedisResult<R> {
        let packed = self.packed();
        let mut loaded = false;
        loop {
            let last = c.send_parts(&[&packed], 1).await?.pop();
            let last = into_result(last.expect("one reply per command"));
            match self.reply_or_reload(last, loaded) {
                Some(r) => return r,
                None => {
                    self.load(loader).await?;
                    loaded = true;
                }
            }
        }
    }

    /// Runs it on a connection of a task's own, loading what it calls through `loader`
    /// (the shared connection) when Redis does not have it.
    pub(crate) async fn invoke_on(
        &self,
        conn: &mut OwnConn,
        loader: &mut crate::conn::Conn,
    ) -> RedisResult<R> {
        if let OwnConn::Lean(c) = conn {
            return self.invoke_lean(c, loader).await;
        }
        let cmd = self.cmd.to_cmd();
        let v = match conn.query(&cmd).await {
            Err(e) if library::not_loaded(&e) => {
                self.load(loader).await?;
                conn.query(&cmd).await?
            }
            r => r.map_err(library::explain)?,
        };
        (self.reply)(v)
    }
}
