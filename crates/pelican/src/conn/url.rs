//! Redis URLs: checked and turned into clients (with their TLS settings), and shown
//! without their password.

use crate::error::{Error, Result};

/// `url` with its password replaced by `***`, for messages and logs:
/// `redis://user:secret@host:6379` becomes `redis://user:***@host:6379`.
pub fn redacted_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                // `redis://secret@host`: a lone credential is taken as the password.
                None => format!("{}***{}", &url[..s + 3], &url[at..]),
            }
        }
        _ => url.to_string(),
    }
}

/// The Redis client for the single-node URL `url` (a queue's, or one node of its
/// cluster), trusting `tls_root_ca_pem` for `rediss://`.
pub(crate) fn node_client(url: &str, tls_root_ca_pem: Option<&[u8]>) -> Result<redis::Client> {
    let info = connection_info(url)?;
    if url.starts_with("rediss://") {
        return tls_client(url, info, tls_root_ca_pem);
    }
    redis::Client::open(info).map_err(|e| bad_url(url, e))
}

fn bad_url(url: &str, e: redis::RedisError) -> Error {
    Error::config(format!(
        "invalid Redis URL {:?}: {e}; expected redis://[user:password@]host[:port][/db]",
        redacted_url(url)
    ))
    .with_source(e)
}

#[cfg(feature = "tls")]
fn tls_client(url: &str, info: redis::ConnectionInfo, ca: Option<&[u8]>) -> Result<redis::Client> {
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: ca.map(<[u8]>::to_vec),
    };
    redis::Client::build_with_tls(info, certs).map_err(|e| bad_url(url, e))
}

#[cfg(not(feature = "tls"))]
fn tls_client(url: &str, _: redis::ConnectionInfo, _: Option<&[u8]>) -> Result<redis::Client> {
    Err(Error::config(format!(
        "{:?} asks for TLS, but pelican was built without it: enable the `tls` feature",
        redacted_url(url)
    )))
}

fn connection_info(url: &str) -> Result<redis::ConnectionInfo> {
    let scheme_ok = url.starts_with("redis://")
        || url.starts_with("rediss://")
        || url.starts_with("unix://")
        || url.starts_with("redis+unix://");
    if !scheme_ok {
        return Err(Error::config(format!(
            "invalid Redis URL {:?}: expected redis://[user:password@]host[:port][/db] \
             (or rediss:// for TLS, redis+cluster://host:port[,host:port...] for a cluster)",
            redacted_url(url)
        )));
    }
    use redis::IntoConnectionInfo;
    // TCP_NODELAY: requests are small and latency-bound; Nagle's algorithm would hold
    // a pipelined write back until the previous one is acknowledged.
    Ok(url
        .into_connection_info()
        .map_err(|e| bad_url(url, e))?
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true)))
}
