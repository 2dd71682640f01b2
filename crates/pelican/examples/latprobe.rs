//! Latency probe (development aid): XADD round trip while another connection is
//! blocked reading the stream (`latprobe URL`), in this process or another.
use redis::IntoConnectionInfo;
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let url = std::env::args().nth(1).unwrap();
    let mode = std::env::args().nth(2).unwrap_or_default();
    let info = url
        .as_str()
        .into_connection_info()
        .unwrap()
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    let c = redis::Client::open(info).unwrap();
    let mut m = c.get_multiplexed_async_connection().await.unwrap();
    let cfg = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut b = c
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .unwrap();
    if mode == "reader" {
        let mut last = "$".to_string();
        loop {
            let v: redis::Value = redis::cmd("XREAD")
                .arg("BLOCK")
                .arg(0)
                .arg("STREAMS")
                .arg("probe")
                .arg(&last)
                .query_async(&mut b)
                .await
                .unwrap();
            if let redis::Value::Array(s) = v {
                if let redis::Value::Array(e) = &s[0] {
                    if let redis::Value::Array(es) = &e[1] {
                        if let redis::Value::Array(x) = &es[es.len() - 1] {
                            if let redis::Value::BulkString(id) = &x[0] {
                                last = String::from_utf8_lossy(id).into();
                            }
                        }
                    }
                }
            }
        }
    }
    if mode == "local" {
        tokio::spawn(async move {
            let mut last = "$".to_string();
            loop {
                let v: redis::Value = redis::cmd("XREAD")
                    .arg("BLOCK")
                    .arg(0)
                    .arg("STREAMS")
                    .arg("probe")
                    .arg(&last)
                    .query_async(&mut b)
                    .await
                    .unwrap();
                if let redis::Value::Array(s) = v {
                    if let redis::Value::Array(e) = &s[0] {
                        if let redis::Value::Array(es) = &e[1] {
                            if let redis::Value::Array(x) = &es[es.len() - 1] {
                                if let redis::Value::BulkString(id) = &x[0] {
                                    last = String::from_utf8_lossy(id).into();
                                }
                            }
                        }
                    }
                }
            }
        });
    }
    let mut v = Vec::new();
    for _ in 0..2000 {
        let t = std::time::Instant::now();
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
        v.push(t.elapsed().as_micros());
        tokio::time::sleep(std::time::Duration::from_micros(200)).await;
    }
    v.sort();
    println!("{mode}: xadd p50 {}us p99 {}us", v[1000], v[1980]);
}
