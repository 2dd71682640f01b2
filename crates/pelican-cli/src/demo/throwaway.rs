//! Which Redis the demo uses: the one at --redis, or a throwaway `redis-server` it starts
//! (and stops at the end).

use super::say::Say;
use crate::cli::{DemoArgs, Global, DEFAULT_REDIS_URL};
use crate::exit::{CliError, CliResult};
use crate::redis_local::{self, LocalRedis, Unreachable};
use crate::redis_url::RedisUrl;

/// Uses the Redis at --redis; starts a throwaway one when asked to, or when nothing
/// answers at the default URL and `redis-server` is on PATH.
pub(super) async fn redis_for_demo(
    g: &Global,
    args: &DemoArgs,
    out: &Say,
) -> CliResult<(RedisUrl, Option<LocalRedis>)> {
    let start = |why: String| async move {
        let bin = redis_local::find_redis_server().ok_or_else(|| {
            CliError::failure(
                "--throwaway-redis needs redis-server on PATH: install Redis (Debian/Ubuntu: \
                 `sudo apt-get install redis-server`; macOS: `brew install redis`)",
            )
        })?;
        let local = LocalRedis::start(&bin).await?;
        out.say(format!(
            "{why}; started a throwaway redis-server at {} for this demo (it is stopped at \
             the end)",
            local.url()
        ));
        Ok::<_, CliError>(local)
    };
    if args.throwaway_redis {
        let local = start("--throwaway-redis".into()).await?;
        return Ok((local.url().into(), Some(local)));
    }
    let url = g.redis.as_str();
    match redis_local::probe(url).await {
        Ok(()) => Ok((g.redis.clone(), None)),
        Err(Unreachable::Down(cause)) if url == DEFAULT_REDIS_URL => {
            if redis_local::find_redis_server().is_none() {
                return Err(redis_local::how_to_get_redis(
                    url,
                    &Unreachable::Down(cause),
                ));
            }
            let local = start(format!("No Redis answered at {url} ({cause})")).await?;
            Ok((local.url().into(), Some(local)))
        }
        Err(why) => Err(redis_local::unreachable_error(url, &why)),
    }
}
