//! Latency probe (development aid): round trips of a few commands on one connection.
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let url = std::env::args().nth(1).unwrap();
    use redis::IntoConnectionInfo;
    let mut info = url.as_str().into_connection_info().unwrap();
    if std::env::var("NODELAY").is_ok() {
        info = info.set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    }
    let c = redis::Client::open(info).unwrap();
    let mut m = c.get_multiplexed_async_connection().await.unwrap();
    let s = redis::Script::new("return redis.call('XADD', KEYS[1], '*', 'a', ARGV[1])");
    for what in ["ping", "xadd", "script"] {
        let mut v = Vec::new();
        for _ in 0..2000 {
            let t = std::time::Instant::now();
            match what {
                "ping" => {
                    let _: String = redis::cmd("PING").query_async(&mut m).await.unwrap();
                }
                "xadd" => {
                    let _: String = redis::cmd("XADD")
                        .arg("probe")
                        .arg("MAXLEN")
                        .arg(10)
                        .arg("*")
                        .arg("a")
                        .arg("b")
                        .query_async(&mut m)
                        .await
                        .unwrap();
                }
                _ => {
                    let _: String = s.key("probe2").arg("b").invoke_async(&mut m).await.unwrap();
                }
            }
            v.push(t.elapsed().as_micros());
        }
        v.sort();
        println!("{what} p50 {}us p99 {}us", v[1000], v[1980]);
    }
    let _: () = redis::cmd("DEL")
        .arg("probe")
        .arg("probe2")
        .query_async(&mut m)
        .await
        .unwrap();
}
