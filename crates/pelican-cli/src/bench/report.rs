//! What a run measured, as one JSON line (the peer benchmark's fields first, in its
//! order) or as a table for humans.

use super::load::Phase;
use super::server::ServerDelta;
use super::sys::{round1, CpuSplit};
use serde_json::{json, Value};

/// Commands listed by name in the breakdown; the rest are summed up as `other`.
const TOP_COMMANDS: usize = 8;

/// Everything a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The queue the run used (gone by the time this is printed).
    pub queue: String,
    /// Dedup on?
    pub dedup: bool,
    /// Unmeasured warm-up requests.
    pub warmup: u64,
    /// Worker processes.
    pub workers: u64,
    /// Handlers at once per worker.
    pub concurrency: u64,
    /// Deliveries held at once per worker.
    pub prefetch: u64,
    /// Size of the payload's filler.
    pub payload_bytes: u64,
    /// Size of each answer's filler (`--response-bytes`).
    pub response_bytes: u64,
    /// How bodies were encoded ("json" or "raw").
    pub codec: &'static str,
    /// How requests were sent: "library" (a producer in the bench) or "gateway" (HTTP
    /// to `pelican gateway`).
    pub via: &'static str,
    /// The throughput phase.
    pub tp: Phase,
    /// The latency phase (one at a time).
    pub lat: Phase,
    /// What Redis did during the throughput phase.
    pub server: ServerDelta,
    /// On a cluster, what each master did (address, delta); empty on one node.
    pub nodes: Vec<(String, ServerDelta)>,
    /// The queue's partitions.
    pub partitions: u32,
    /// CPU during the throughput phase.
    pub cpu: CpuSplit,
    /// Resident memory (kB) per role after the warm-up.
    pub rss_start: Vec<(&'static str, Option<u64>)>,
    /// Resident memory (kB) per role after the throughput phase.
    pub rss_end: Vec<(&'static str, Option<u64>)>,
    /// Peak resident memory (VmHWM) per role at the end of the throughput phase, kB.
    pub rss_peak: Vec<(&'static str, Option<u64>)>,
    /// Answers received and checked (all phases).
    pub checked: u64,
    /// Keys of the queue deleted at the end.
    pub keys_deleted: u64,
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl Report {
    /// Minor page faults per request of the throughput phase, per role.
    fn faults_per_req(&self) -> impl Iterator<Item = (&'static str, Option<f64>)> + '_ {
        let n = self.tp.requests.max(1) as f64;
        self.cpu
            .faults
            .iter()
            .map(move |(role, f)| (*role, f.map(|f| f as f64 / n)))
    }

    /// Redis commands per request of the throughput phase (commands run by scripts
    /// included).
    pub fn cmds_per_req(&self) -> f64 {
        self.server.total() as f64 / self.tp.requests.max(1) as f64
    }

    /// Redis CPU per request of the throughput phase, µs.
    pub fn redis_us_per_req(&self) -> f64 {
        self.server.cpu_us as f64 / self.tp.requests.max(1) as f64
    }

    /// The most frequent commands per request, then `other`.
    fn breakdown(&self) -> Vec<(String, f64)> {
        let per = |n: u64| r2(n as f64 / self.tp.requests.max(1) as f64);
        let mut out: Vec<(String, f64)> = self
            .server
            .calls
            .iter()
            .take(TOP_COMMANDS)
            .map(|(name, n)| (name.clone(), per(*n)))
            .collect();
        let rest: u64 = self
            .server
            .calls
            .iter()
            .skip(TOP_COMMANDS)
            .map(|(_, n)| n)
            .sum();
        if rest > 0 {
            out.push(("other".into(), per(rest)));
        }
        out
    }

    /// The one JSON line: the peer's fields first, then ours, in a fixed order.
    pub fn json_line(&self) -> String {
        let rss = |v: &[(&'static str, Option<u64>)]| {
            object(
                v.iter()
                    .map(|(r, kb)| (r.to_string(), json!(kb).to_string())),
            )
        };
        let breakdown = object(
            self.breakdown()
                .into_iter()
                .map(|(name, per)| (name, json!(per).to_string())),
        );
        let mut cpu = vec![("machine".to_string(), json!(self.cpu.machine).to_string())];
        cpu.extend(
            self.cpu
                .roles
                .iter()
                .map(|(r, v)| (r.to_string(), json!(v).to_string())),
        );
        cpu.push(("other".into(), json!(self.cpu.other).to_string()));
        let (tp, lat) = (&self.tp.latencies, &self.lat.latencies);
        let values: Vec<(&str, Value)> = vec![
            ("system", json!("pelican")),
            ("version", json!(env!("CARGO_PKG_VERSION"))),
            ("dedup", json!(self.dedup)),
            ("throughput_rps", json!(round1(self.tp.rate()))),
            ("tp_p50_ms", json!(r3(tp.quantile_ms(0.5)))),
            ("tp_p99_ms", json!(r3(tp.quantile_ms(0.99)))),
            ("lat_p50_ms", json!(r3(lat.quantile_ms(0.5)))),
            ("lat_p99_ms", json!(r3(lat.quantile_ms(0.99)))),
            ("redis_cmds_per_req", json!(r2(self.cmds_per_req()))),
            (
                "redis_cpu_us_per_req",
                json!(round1(self.redis_us_per_req())),
            ),
            ("tp_p90_ms", json!(r3(tp.quantile_ms(0.9)))),
            ("tp_max_ms", json!(r3(tp.max_ms()))),
            ("tp_mean_ms", json!(r3(tp.mean_ms()))),
            ("tp_wall_ms", json!(r3(self.tp.wall.as_secs_f64() * 1000.0))),
            ("lat_p90_ms", json!(r3(lat.quantile_ms(0.9)))),
            ("lat_max_ms", json!(r3(lat.max_ms()))),
            ("lat_mean_ms", json!(r3(lat.mean_ms()))),
            ("requests", json!(self.tp.requests)),
            ("inflight", json!(self.tp.inflight)),
            ("latency_requests", json!(self.lat.requests)),
            ("warmup", json!(self.warmup)),
            ("workers", json!(self.workers)),
            ("concurrency", json!(self.concurrency)),
            ("prefetch", json!(self.prefetch)),
            ("payload_bytes", json!(self.payload_bytes)),
            ("response_bytes", json!(self.response_bytes)),
            ("codec", json!(self.codec)),
            ("via", json!(self.via)),
            ("answers_checked", json!(self.checked)),
            ("bad_answers", json!(0)),
            ("partitions", json!(self.partitions.max(1))),
        ];
        let mut fields: Vec<(String, String)> = values
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        fields.extend([
            ("redis_cmds".to_string(), breakdown),
            ("tp_cpu_pct".to_string(), object(cpu)),
            (
                "tp_faults_per_req".to_string(),
                object(
                    self.faults_per_req()
                        .map(|(role, f)| (role.to_string(), json!(f.map(r2)).to_string())),
                ),
            ),
            ("rss_kb_start".to_string(), rss(&self.rss_start)),
            ("rss_kb_end".to_string(), rss(&self.rss_end)),
            ("rss_kb_peak".to_string(), rss(&self.rss_peak)),
            ("queue".to_string(), json!(self.queue).to_string()),
            (
                "keys_deleted".to_string(),
                json!(self.keys_deleted).to_string(),
            ),
            ("keys_left".to_string(), "0".to_string()),
        ]);
        if !self.nodes.is_empty() {
            let total = self.server.cpu_us.max(1) as f64;
            let per = |n: u64| n as f64 / self.tp.requests.max(1) as f64;
            let nodes: Vec<Value> = self
                .nodes
                .iter()
                .map(|(addr, d)| {
                    json!({
                        "node": addr,
                        "redis_cpu_us_per_req": round1(per(d.cpu_us)),
                        "redis_cmds_per_req": r2(per(d.total())),
                        "cpu_share": r3(d.cpu_us as f64 / total),
                    })
                })
                .collect();
            fields.push(("nodes".to_string(), json!(nodes).to_string()));
        }
        object(fields)
    }

    /// The table for humans.
    pub fn table(&self) -> String {
        let mut rows: Vec<[String; 8]> = vec![[
            "phase".into(),
            "requests".into(),
            "in flight".into(),
            "req/s".into(),
            "p50".into(),
            "p90".into(),
            "p99".into(),
            "max".into(),
        ]];
        for (name, p) in [("throughput", &self.tp), ("latency", &self.lat)] {
            if p.requests == 0 {
                continue;
            }
            let h = &p.latencies;
            rows.push([
                name.into(),
                p.requests.to_string(),
                p.inflight.to_string(),
                format!("{:.0}", p.rate()),
                ms(h.quantile_ms(0.5)),
                ms(h.quantile_ms(0.9)),
                ms(h.quantile_ms(0.99)),
                ms(h.max_ms()),
            ]);
        }
        let widths: Vec<usize> = (0..8)
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let rule: String = widths
            .iter()
            .map(|w| format!("+{}", "-".repeat(w + 2)))
            .collect::<String>()
            + "+\n";
        let mut out = format!(
            "pelican bench {}: dedup {}, {} worker process{} x concurrency {} (prefetch {}), \
             payload {} bytes ({}), answer filler {} bytes, {} warm-up requests{}\n",
            env!("CARGO_PKG_VERSION"),
            if self.dedup { "on" } else { "off" },
            self.workers,
            if self.workers == 1 { "" } else { "es" },
            self.concurrency,
            self.prefetch,
            self.payload_bytes,
            self.codec,
            self.response_bytes,
            self.warmup,
            if self.via == "gateway" {
                ", through pelican gateway (HTTP)"
            } else {
                ""
            },
        );
        out.push_str(&rule);
        for (n, row) in rows.iter().enumerate() {
            for (c, cell) in row.iter().enumerate() {
                let w = widths[c];
                if c == 0 {
                    out.push_str(&format!("| {cell:<w$} "));
                } else {
                    out.push_str(&format!("| {cell:>w$} "));
                }
            }
            out.push_str("|\n");
            if n == 0 {
                out.push_str(&rule);
            }
        }
        out.push_str(&rule);
        let breakdown: Vec<String> = self
            .breakdown()
            .iter()
            .map(|(name, per)| format!("{name} {per}"))
            .collect();
        if !self.nodes.is_empty() {
            let total = self.server.cpu_us.max(1) as f64;
            for (addr, d) in &self.nodes {
                out.push_str(&format!(
                    "  node {addr}: {:.1} µs of CPU per request, {:.0} % of the cluster's\n",
                    d.cpu_us as f64 / self.tp.requests.max(1) as f64,
                    100.0 * d.cpu_us as f64 / total
                ));
            }
        }
        out.push_str(&format!(
            "Redis per request (throughput phase): {:.2} commands, scripts' commands included \
             ({}); {:.1} µs of server CPU\n",
            self.cmds_per_req(),
            breakdown.join(", "),
            self.redis_us_per_req(),
        ));
        out.push_str(&format!(
            "CPU during the throughput phase, % of one core: {}\n",
            self.cpu.line()
        ));
        let faults: Vec<String> = self
            .faults_per_req()
            .map(|(role, f)| match f {
                Some(f) => format!("{role} {f:.2}"),
                None => format!("{role} ?"),
            })
            .collect();
        out.push_str(&format!(
            "Page faults per request (fresh pages from the kernel), throughput phase: {}\n",
            faults.join(", ")
        ));
        let mut mem = Vec::new();
        for ((role, a), (_, b)) in self.rss_start.iter().zip(&self.rss_end) {
            mem.push(match (a, b) {
                (Some(a), Some(b)) => format!(
                    "{role} {a} -> {b} kB ({:+.1} %)",
                    (*b as f64 - *a as f64) * 100.0 / (*a).max(1) as f64
                ),
                _ => format!("{role} unknown"),
            });
        }
        out.push_str(&format!(
            "Resident memory, after the warm-up -> after the throughput phase: {}\n",
            mem.join("; ")
        ));
        out.push_str(&format!(
            "{} answers checked, all right; queue {} removed ({} keys), none left\n",
            self.checked, self.queue, self.keys_deleted
        ));
        out
    }
}

/// A JSON object from (name, JSON text) pairs, in their order (serde_json's map would
/// sort the names).
fn object(fields: impl IntoIterator<Item = (String, String)>) -> String {
    let body: Vec<String> = fields
        .into_iter()
        .map(|(k, v)| format!("{}:{v}", Value::from(k)))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// A latency in ms with the precision that reads well: `0.213 ms`, `4.52 ms`, `31.2 ms`.
fn ms(x: f64) -> String {
    if x < 1.0 {
        format!("{x:.3} ms")
    } else if x < 10.0 {
        format!("{x:.2} ms")
    } else {
        format!("{x:.1} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample() -> Report {
        let mut tp = Phase {
            requests: 100,
            inflight: 10,
            wall: Duration::from_millis(50),
            ..Phase::default()
        };
        for us in 1..=100 {
            tp.latencies.record(Duration::from_micros(us * 10));
        }
        Report {
            queue: "bench-1-2".into(),
            dedup: true,
            tp,
            server: ServerDelta {
                calls: vec![("fcall".into(), 200), ("xadd".into(), 150)],
                cpu_us: 2_000,
            },
            cpu: CpuSplit {
                machine: Some(150.0),
                roles: vec![
                    ("producer", Some(50.0)),
                    ("worker", None),
                    ("redis", Some(90.0)),
                ],
                other: Some(10.0),
                faults: vec![("producer", Some(300)), ("worker", None)],
            },
            rss_start: vec![("producer", Some(1000)), ("worker", None)],
            rss_end: vec![("producer", Some(1100)), ("worker", None)],
            rss_peak: vec![("producer", Some(1200)), ("worker", None)],
            ..Report::default()
        }
    }

    #[test]
    fn the_json_line_starts_with_the_peer_fields() {
        let line = sample().json_line();
        assert!(!line.contains('\n'));
        assert!(
            line.starts_with(r#"{"system":"pelican","version":""#),
            "{line}"
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["throughput_rps"], 2000.0);
        assert_eq!(v["redis_cmds_per_req"], 3.5);
        assert_eq!(v["redis_cpu_us_per_req"], 20.0);
        assert_eq!(v["tp_p50_ms"], 0.5);
        assert_eq!(v["redis_cmds"]["xadd"], 1.5);
        assert_eq!(v["rss_kb_end"]["producer"], 1100);
        assert!(v["rss_kb_end"]["worker"].is_null());
        assert_eq!(v["tp_faults_per_req"]["producer"], 3.0);
        assert!(v["tp_faults_per_req"]["worker"].is_null());
        assert!(
            line.contains(r#""tp_cpu_pct":{"machine":150.0,"producer":50.0,"worker":null,"redis":90.0,"other":10.0}"#),
            "{line}"
        );
    }

    #[test]
    fn table_rows_line_up() {
        let t = sample().table();
        let widths: Vec<usize> = t
            .lines()
            .filter(|l| l.starts_with('|') || l.starts_with('+'))
            .map(|l| l.chars().count())
            .collect();
        assert_eq!(widths.len(), 5, "{t}");
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{t}");
        assert!(t.contains("producer 1000 -> 1100 kB (+10.0 %)"), "{t}");
    }
}
