//! TLS for test servers: the certificate files a server is given, and a throwaway CA
//! that makes them with the `openssl` command.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::sys::TempDir;

/// The PEM files of a TLS server: its certificate and key, and the CA that signed it
/// (which clients and the other nodes of a cluster trust).
///
/// Cluster nodes and replicas present [`cert`](Self::cert) to each other as a *client*
/// certificate (the cluster bus always asks for one), so it must be valid for
/// `127.0.0.1` and allowed for both uses (extended key usage `serverAuth,clientAuth`, or
/// none): with `serverAuth` only, the nodes' handshakes fail and the cluster never
/// forms. [`TestCa`] makes such a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate (`--tls-ca-cert-file`, and what clients trust).
    pub ca_cert: PathBuf,
    /// The server's certificate (`--tls-cert-file`).
    pub cert: PathBuf,
    /// The server certificate's private key (`--tls-key-file`).
    pub key: PathBuf,
}

impl TlsFiles {
    /// The CA certificate's PEM text, e.g. for `QueueConfig::with_tls_root_ca_pem`.
    /// Panics when the file cannot be read.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.ca_cert)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", self.ca_cert.display()))
    }
}

/// A private CA and one certificate it signed for `127.0.0.1` and `localhost` (usable
/// as server and as client certificate), made with the `openssl` command in a
/// temporary directory that is removed on Drop. Keys are P-256, valid for 2 days.
///
/// Panics with a clear message when `openssl` is missing or fails.
#[derive(Debug)]
pub struct TestCa {
    dir: TempDir,
}

impl TestCa {
    /// Makes the CA and the certificate (a few ms of `openssl`).
    pub fn new() -> TestCa {
        let ca = TestCa {
            dir: TempDir::new("tls"),
        };
        std::fs::write(
            ca.path("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
             extendedKeyUsage=serverAuth,clientAuth\n\
             basicConstraints=CA:FALSE\n",
        )
        .expect("write server.ext");
        let curve = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let ca_subject = ["-subj", "/CN=pelican test CA", "-days", "2"];
        ca.openssl(
            &[
                &["req", "-x509"][..],
                &curve,
                &["-keyout", "ca.key", "-out", "ca.crt"],
                &ca_subject,
            ]
            .concat(),
        );
        ca.openssl(
            &[
                &["req"][..],
                &curve,
                &["-keyout", "server.key", "-out", "server.csr"],
                &["-subj", "/CN=localhost"],
            ]
            .concat(),
        );
        ca.openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]);
        ca
    }

    /// The files to give a server ([`crate::RedisServerBuilder::tls`],
    /// [`crate::RedisCluster::start_tls`]).
    pub fn files(&self) -> TlsFiles {
        TlsFiles {
            ca_cert: self.path("ca.crt"),
            cert: self.path("server.crt"),
            key: self.path("server.key"),
        }
    }

    /// A file in the CA's directory (`ca.crt`, `server.crt`, `server.key`, ...).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|e| {
                panic!("the openssl command is needed to make the test CA and was not found: {e}")
            });
        assert!(
            out.status.success(),
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}
