//! The API's listeners: the unix socket and who may use it, the TLS port, and what each peer
//! may hold (`--socket`, `--api-*`, `--listen`, `--tls-*`).

use super::{Config, ConfigError};

/// Default path of the API socket.
pub const DEFAULT_SOCKET: &str = "/run/plegd/plegd.sock";

/// `--api-max-connections`: each listener's connections, far more than a node's agents use.
pub const DEFAULT_API_MAX_CONNECTIONS: usize = 512;
/// `--api-max-connections-per-peer`: a peer's share of a listener's connections.
pub const DEFAULT_API_MAX_CONNECTIONS_PER_PEER: usize = 128;
/// `--api-max-streams-per-peer`: a peer's RPCs in flight (each never-reading watcher holds up
/// to `--watch-queue` events: this bounds what one peer can pin).
pub const DEFAULT_API_MAX_STREAMS_PER_PEER: usize = 256;

/// The limits of one API listener (`--api-max-*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiLimits {
    /// Connections held at once.
    pub connections: usize,
    /// Connections held at once by one peer.
    pub connections_per_peer: usize,
    /// RPCs in flight at once for one peer, over all its connections.
    pub streams_per_peer: usize,
}

impl Config {
    /// The TCP listener is served over TLS, to authenticated clients unless asked otherwise by
    /// name, and someone may use the socket.
    pub(super) fn validate_api(&self) -> Result<(), ConfigError> {
        if self.listen.is_some() && (self.tls_cert.is_none() || self.tls_key.is_none()) {
            return Err(ConfigError::ListenWithoutTls);
        }
        if self.listen.is_some()
            && self.tls_client_ca.is_none()
            && !self.tls_allow_unauthenticated_clients
        {
            return Err(ConfigError::ListenWithoutClientAuth);
        }
        if self.api_allow_uids.is_empty() && self.api_allow_gids.is_empty() {
            return Err(ConfigError::NobodyAllowed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::{io::Write as _, path::PathBuf};

    use crate::config::*;

    #[test]
    fn api_settings_default_to_the_socket_only_and_tls_needs_a_certificate() {
        let config = Config::load(&RunArgs::default()).unwrap();
        assert_eq!(config.socket, PathBuf::from("/run/plegd/plegd.sock"));
        assert_eq!((config.listen, config.metrics_address), (None, None));
        assert_eq!((config.event_history, config.watch_queue), (10_000, 1024));
        assert_eq!(config.pod_metadata.max_bytes, 16 * 1024);
        // Root only.
        assert_eq!(config.api_allow_uids, [0]);
        assert!(config.api_allow_gids.is_empty());
        let plain_tcp = RunArgs {
            listen: Some("127.0.0.1:9810".parse().unwrap()),
            ..RunArgs::default()
        };
        assert!(matches!(
            Config::load(&plain_tcp),
            Err(ConfigError::ListenWithoutTls)
        ));
        // A certificate and no client CA: refused unless asked for by name.
        let anyone = RunArgs {
            tls_cert: Some("server.pem".into()),
            tls_key: Some("server.key".into()),
            ..plain_tcp
        };
        assert!(matches!(
            Config::load(&anyone),
            Err(ConfigError::ListenWithoutClientAuth)
        ));
        let asked = Config::load(&RunArgs {
            tls_allow_unauthenticated_clients: Some(true),
            ..anyone.clone()
        })
        .unwrap();
        assert!(asked.tls_allow_unauthenticated_clients && asked.tls_client_ca.is_none());
        Config::load(&RunArgs {
            tls_client_ca: Some("ca.pem".into()),
            ..anyone
        })
        .unwrap();
        let nobody = RunArgs {
            api_allow_uids: Some(Vec::new()),
            ..RunArgs::default()
        };
        assert!(matches!(
            Config::load(&nobody),
            Err(ConfigError::NobodyAllowed)
        ));
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "socket = \"/tmp/p.sock\"\nmetrics-address = \"127.0.0.1:9809\"\nevent-history = 5\n\
             api-allow-uids = []\napi-allow-gids = [1000, 1001]"
        )
        .unwrap();
        let config = Config::load(&RunArgs {
            config: Some(file.path().to_owned()),
            ..RunArgs::default()
        })
        .unwrap();
        assert_eq!(config.socket, PathBuf::from("/tmp/p.sock"));
        assert_eq!(
            config.metrics_address,
            Some("127.0.0.1:9809".parse().unwrap())
        );
        assert_eq!(config.event_history, 5);
        assert!(config.api_allow_uids.is_empty());
        assert_eq!(config.api_allow_gids, [1000, 1001]);
    }
}
