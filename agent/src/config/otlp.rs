//! Where events are exported over OTLP (`--otlp-*`), checked together.

use std::path::PathBuf;

use super::ConfigError;

/// Where and how events are exported over OTLP (`--otlp-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpConfig {
    /// `http://HOST:PORT` or `https://HOST:PORT`, checked.
    pub endpoint: String,
    /// With https: the CA that signed the receiver's certificate.
    pub ca: Option<PathBuf>,
    /// A client certificate and its key, for receivers that ask for one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl OtlpConfig {
    /// Whether the endpoint is reached over TLS.
    pub fn tls(&self) -> bool {
        self.endpoint.starts_with("https://")
    }

    pub(super) fn resolve(
        endpoint: Option<String>,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<Option<Self>, ConfigError> {
        let Some(endpoint) = endpoint.filter(|e| !e.is_empty()) else {
            return match (&ca, &cert, &key) {
                (None, None, None) => Ok(None),
                _ => Err(ConfigError::Otlp(
                    "otlp-tls-ca, otlp-tls-cert and otlp-tls-key need otlp-endpoint".into(),
                )),
            };
        };
        let invalid = |why: &str| ConfigError::Otlp(format!("otlp-endpoint {endpoint:?}: {why}"));
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(invalid("give http://HOST:PORT or https://HOST:PORT")),
        };
        if uri.host().is_none_or(str::is_empty) {
            return Err(invalid("no host"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(invalid(
                "OTLP/gRPC takes no path: give http://HOST:PORT or https://HOST:PORT",
            ));
        }
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(ConfigError::Otlp(
                    "otlp-tls-cert and otlp-tls-key go together".into(),
                ));
            }
        };
        if tls && ca.is_none() {
            return Err(invalid(
                "an https endpoint needs otlp-tls-ca (the system's bundle, \
                 /etc/ssl/certs/ca-certificates.crt, for a public CA)",
            ));
        }
        if !tls && (ca.is_some() || identity.is_some()) {
            return Err(invalid(
                "otlp-tls-* settings need an https endpoint: this one is plain http",
            ));
        }
        Ok(Some(Self {
            endpoint: uri.to_string().trim_end_matches('/').to_owned(),
            ca,
            identity,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::config::*;

    #[test]
    fn otlp_settings_are_checked_together() {
        let otlp = |endpoint: Option<&str>, ca: Option<&str>, cert: Option<&str>| {
            Config::load(&RunArgs {
                otlp_endpoint: endpoint.map(str::to_owned),
                otlp_tls_ca: ca.map(PathBuf::from),
                otlp_tls_cert: cert.map(PathBuf::from),
                otlp_tls_key: cert.map(|_| PathBuf::from("client.key")),
                ..RunArgs::default()
            })
            .map(|config| {
                config
                    .otlp
                    .map(|o| (o.tls(), o.identity.is_some(), o.endpoint))
            })
            .map_err(|e| e.to_string())
        };
        let ok = |endpoint: &str, tls, identity| Ok(Some((tls, identity, endpoint.to_owned())));
        assert_eq!(otlp(None, None, None), Ok(None));
        assert_eq!(
            otlp(Some("http://127.0.0.1:4317"), None, None),
            ok("http://127.0.0.1:4317", false, false)
        );
        assert_eq!(
            otlp(Some("http://localhost:4317/"), None, None),
            ok("http://localhost:4317", false, false)
        );
        assert_eq!(
            otlp(Some("https://otel:4317"), Some("ca.pem"), Some("c.pem")),
            ok("https://otel:4317", true, true)
        );
        let refused = [
            (None, Some("ca.pem"), None, "need otlp-endpoint"),
            (Some("localhost:4317"), None, None, "give http://HOST:PORT"),
            (
                Some("grpc://otel:4317"),
                None,
                None,
                "give http://HOST:PORT",
            ),
            (
                Some("http://otel:4317/v1/logs"),
                None,
                None,
                "takes no path",
            ),
            (Some("http://"), None, None, "otlp-endpoint"),
            (Some("https://otel:4317"), None, None, "needs otlp-tls-ca"),
            (
                Some("http://otel:4317"),
                Some("ca.pem"),
                None,
                "need an https",
            ),
        ];
        for (endpoint, ca, cert, why) in refused {
            let error = otlp(endpoint, ca, cert).expect_err(why);
            assert!(error.contains(why), "{endpoint:?}: {error}");
        }
    }
}
