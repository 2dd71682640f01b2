//! What the Redis server says: command counts (INFO commandstats, which also counts the
//! commands scripts run), its CPU time (INFO cpu), its pid, and the keys a run left.
//! Plus the loopback rule: the bench loads the server hard and only runs against one on
//! this machine.

use crate::exit::{CliError, CliResult};
use pelican::admin::redacted_url;
use redis::aio::MultiplexedConnection;
use redis::ConnectionAddr;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The single-node URLs of a `redis+cluster://` URL's seeds (with its credentials), or
/// `None` for a single-node URL.
fn cluster_seeds(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
        ("redis", r)
    } else {
        ("rediss", url.strip_prefix("rediss+cluster://")?)
    };
    let (creds, hosts) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    Some(
        hosts
            .trim_end_matches('/')
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{scheme}://{creds}{h}"))
            .collect(),
    )
}

/// Fails unless `url` names servers on this machine (loopback addresses or a Unix
/// socket; for a cluster, every seed).
pub fn require_loopback(url: &str) -> CliResult {
    if let Some(seeds) = cluster_seeds(url) {
        for seed in seeds {
            require_loopback(&seed).map_err(|_| {
                CliError::usage(format!(
                    "refusing to benchmark the cluster at {}: `pelican bench` only runs \
                     against servers on this machine (loopback addresses)",
                    redacted_url(url)
                ))
            })?;
        }
        return Ok(());
    }
    let client = redis::Client::open(url)
        .map_err(|e| CliError::usage(format!("invalid Redis URL {}: {e}", redacted_url(url))))?;
    let host = match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, _) => host.clone(),
        ConnectionAddr::TcpTls { host, .. } => host.clone(),
        ConnectionAddr::Unix(_) => return Ok(()),
        _ => String::new(),
    };
    if is_loopback(&host) {
        return Ok(());
    }
    Err(CliError::usage(format!(
        "refusing to benchmark the Redis at {}: `pelican bench` loads the server hard and \
         measures this machine's processes, so it only runs against a loopback address \
         (127.0.0.1, ::1, localhost) or a Unix socket",
        redacted_url(url)
    )))
}

fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The servers a run loads: the one node, or every master of a cluster, each with a
/// connection for the bench's own questions.
pub struct Servers {
    pub nodes: Vec<(String, MultiplexedConnection)>,
}

impl Servers {
    pub async fn connect(url: &str) -> CliResult<Servers> {
        let Some(seeds) = cluster_seeds(url) else {
            return Ok(Servers {
                nodes: vec![("redis".into(), connect(url).await?)],
            });
        };
        let first = seeds
            .first()
            .ok_or_else(|| CliError::usage("a cluster URL without seed nodes"))?;
        let mut seed = connect(first).await?;
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut seed)
            .await
            .map_err(|e| redis_error("asking the cluster for its nodes", &e))?;
        let creds = first
            .split_once("://")
            .and_then(|(_, r)| r.rfind('@').map(|at| &r[..=at]))
            .unwrap_or("");
        let scheme = first.split_once("://").map(|(s, _)| s).unwrap_or("redis");
        let mut out = Vec::new();
        // `<id> <ip:port@bus> <flags> ...`: the masters, in slot order is not needed.
        for line in nodes.lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() < 3 || !parts[2].contains("master") || parts[2].contains("fail") {
                continue;
            }
            let addr = parts[1].split('@').next().unwrap_or_default().to_string();
            let conn = connect(&format!("{scheme}://{creds}{addr}")).await?;
            out.push((addr, conn));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Servers { nodes: out })
    }

    /// Every node's counters, in node order.
    pub async fn counters(&mut self) -> CliResult<Vec<ServerCounters>> {
        let mut out = Vec::with_capacity(self.nodes.len());
        for (_, c) in &mut self.nodes {
            out.push(counters(c).await?);
        }
        Ok(out)
    }

    /// The local pid of every node that runs on this machine.
    pub async fn local_pids(&mut self) -> Vec<Option<u32>> {
        let mut out = Vec::new();
        for (_, c) in &mut self.nodes {
            out.push(local_pid(c).await);
        }
        out
    }

    /// Keys containing `needle` on any node.
    pub async fn keys_containing(&mut self, needle: &str) -> CliResult<Vec<String>> {
        let mut out = Vec::new();
        for (_, c) in &mut self.nodes {
            out.extend(keys_containing(c, needle).await?);
        }
        Ok(out)
    }
}

/// A connection for the bench's own questions (not the producer's).
pub async fn connect(url: &str) -> CliResult<MultiplexedConnection> {
    let client =
        redis::Client::open(url).map_err(|e| CliError::usage(format!("invalid Redis URL: {e}")))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| redis_error("connecting", &e))
}

fn redis_error(what: &str, e: &redis::RedisError) -> CliError {
    CliError::failure(format!("Redis failed while {what}: {e}"))
}

/// The server's counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct ServerCounters {
    /// Calls per command (`fcall`, `xadd`, `xgroup|create`, ...).
    pub calls: BTreeMap<String, u64>,
    /// used_cpu_user + used_cpu_sys, in µs.
    pub cpu_us: u64,
}

/// Reads the counters (two INFO calls, which are left out of every count).
pub async fn counters(conn: &mut MultiplexedConnection) -> CliResult<ServerCounters> {
    let (stats, cpu): (String, String) = redis::pipe()
        .cmd("INFO")
        .arg("commandstats")
        .cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .map_err(|e| redis_error("reading INFO", &e))?;
    Ok(ServerCounters {
        calls: parse_commandstats(&stats),
        cpu_us: parse_cpu_us(&cpu),
    })
}

/// `cmdstat_<name>:calls=<n>,usec=...` lines.
fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

fn parse_cpu_us(info: &str) -> u64 {
    info.lines()
        .filter_map(|l| {
            let v = l
                .strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))?;
            v.trim().parse::<f64>().ok()
        })
        .map(|s| (s * 1e6).round() as u64)
        .sum()
}

/// What the server did between two readings.
#[derive(Debug, Clone, Default)]
pub struct ServerDelta {
    /// Calls per command, the bench's own INFO calls left out; most frequent first.
    pub calls: Vec<(String, u64)>,
    /// Server CPU time, µs.
    pub cpu_us: u64,
}

impl ServerDelta {
    /// The difference `after - before`.
    pub fn between(before: &ServerCounters, after: &ServerCounters) -> ServerDelta {
        let mut calls: Vec<(String, u64)> = after
            .calls
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(name, n)| {
                (
                    name.clone(),
                    n.saturating_sub(before.calls.get(name).copied().unwrap_or(0)),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        calls.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        ServerDelta {
            calls,
            cpu_us: after.cpu_us.saturating_sub(before.cpu_us),
        }
    }

    /// Every command counted.
    pub fn total(&self) -> u64 {
        self.calls.iter().map(|(_, n)| n).sum()
    }

    /// The deltas of several nodes added up.
    pub fn sum(parts: &[ServerDelta]) -> ServerDelta {
        let mut calls: BTreeMap<String, u64> = BTreeMap::new();
        for p in parts {
            for (name, n) in &p.calls {
                *calls.entry(name.clone()).or_default() += n;
            }
        }
        let mut calls: Vec<(String, u64)> = calls.into_iter().collect();
        calls.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        ServerDelta {
            calls,
            cpu_us: parts.iter().map(|p| p.cpu_us).sum(),
        }
    }
}

/// The server's pid, if it runs on this machine and /proc shows it as a Redis (or
/// Valkey) server: in a container its pid means nothing here.
pub async fn local_pid(conn: &mut MultiplexedConnection) -> Option<u32> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .ok()?;
    let pid: u32 = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))?
        .trim()
        .parse()
        .ok()?;
    let name = super::sys::process_name(pid)?;
    (name.contains("redis") || name.contains("valkey")).then_some(pid)
}

/// Every key whose name contains `needle` (SCAN, so a busy server is not stalled).
pub async fn keys_containing(
    conn: &mut MultiplexedConnection,
    needle: &str,
) -> CliResult<Vec<String>> {
    // Glob metacharacters in the needle are escaped; queue names have none, but be exact.
    let mut pattern = String::from("*");
    for c in needle.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    let mut cursor: u64 = 0;
    let mut out = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(|e| redis_error("scanning for keys left behind", &e))?;
        out.extend(keys);
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_servers_are_benchmarked() {
        for ok in [
            "redis://127.0.0.1:6379",
            "redis://127.0.0.2",
            "redis://localhost:1",
            "redis://[::1]:6379",
            "redis+unix:///tmp/redis.sock",
        ] {
            assert!(require_loopback(ok).is_ok(), "{ok}");
        }
        for bad in [
            "redis://10.0.0.1:6379",
            "redis://example.com",
            "redis://u:p@8.8.8.8/0",
        ] {
            let e = require_loopback(bad).unwrap_err();
            assert_eq!(e.code, crate::exit::USAGE, "{bad}");
            assert!(e.message.contains("loopback"), "{e}");
            assert!(!e.message.contains(":p@"), "password shown: {e}");
        }
    }

    #[test]
    fn cluster_urls_name_their_seeds() {
        assert_eq!(cluster_seeds("redis://h:1"), None);
        assert_eq!(
            cluster_seeds("redis+cluster://u:p@127.0.0.1:7000,127.0.0.1:7001").unwrap(),
            ["redis://u:p@127.0.0.1:7000", "redis://u:p@127.0.0.1:7001"]
        );
        assert!(require_loopback("redis+cluster://127.0.0.1:1,localhost:2").is_ok());
        assert!(require_loopback("redis+cluster://127.0.0.1:1,10.0.0.1:2").is_err());
    }

    #[test]
    fn info_is_parsed() {
        let stats = "# Commandstats\r\ncmdstat_fcall:calls=40,usec=900,usec_per_call=22.5,rejected_calls=0,failed_calls=0\r\ncmdstat_xgroup|create:calls=1,usec=5\r\ncmdstat_info:calls=7,usec=1\r\n";
        let calls = parse_commandstats(stats);
        assert_eq!(calls.get("fcall"), Some(&40));
        assert_eq!(calls.get("xgroup|create"), Some(&1));
        let before = ServerCounters {
            calls: parse_commandstats("cmdstat_fcall:calls=10,usec=1\r\ncmdstat_info:calls=5"),
            cpu_us: 1_000,
        };
        let after = ServerCounters {
            calls,
            cpu_us: parse_cpu_us("# CPU\r\nused_cpu_sys:0.500000\r\nused_cpu_user:1.25\r\nused_cpu_sys_children:9.0\r\n"),
        };
        assert_eq!(after.cpu_us, 1_750_000);
        let d = ServerDelta::between(&before, &after);
        assert_eq!(
            d.calls,
            [("fcall".to_string(), 30), ("xgroup|create".to_string(), 1)]
        );
        assert_eq!(d.total(), 31);
        assert_eq!(d.cpu_us, 1_749_000);
    }
}
