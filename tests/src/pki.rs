//! A certificate authority for tests of the API's TLS listener: a CA, and PEM files it signs.

use std::path::{Path, PathBuf};

/// A CA, and PEM files signed by it: a server certificate for localhost and client ones.
pub struct Pki {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub ca_pem: String,
}

impl Pki {
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate()?;
        let ca_pem = params.self_signed(&key)?.pem();
        Ok(Self {
            issuer: rcgen::Issuer::new(params, key),
            ca_pem,
        })
    }

    /// (certificate, key) in PEM for `names`, for `purpose`.
    pub fn leaf(
        &self,
        names: &[&str],
        purpose: rcgen::ExtendedKeyUsagePurpose,
    ) -> anyhow::Result<(String, String)> {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params.extended_key_usages.push(purpose);
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// `plegd run`'s TLS flags for a listener on `listen` with a server certificate for
    /// localhost, clients needing one of this CA's (mTLS); the PEM files written in `dir`.
    pub fn listener_args(&self, dir: &Path, listen: &str) -> anyhow::Result<Vec<String>> {
        let (cert, key) = self.leaf(
            &["localhost", "127.0.0.1"],
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let write = |name: &str, pem: &str| -> anyhow::Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, pem)?;
            Ok(path)
        };
        let files = [
            ("--tls-cert", write("server.pem", &cert)?),
            ("--tls-key", write("server.key", &key)?),
            ("--tls-client-ca", write("ca.pem", &self.ca_pem)?),
        ];
        let mut args = vec!["--listen".to_owned(), listen.to_owned()];
        for (flag, path) in files {
            args.extend([flag.to_owned(), path.display().to_string()]);
        }
        Ok(args)
    }
}
