//! Who may use the API socket: an allow-list of uids and gids checked against each peer's
//! credentials (SO_PEERCRED), and the file modes derived from that list.
//!
//! The list decides; the modes only follow it, so they cannot disagree: the socket and its
//! directory are opened exactly as wide as the allowed peers need ([`PeerAllowList::access`]),
//! and every connection is then checked. A peer is allowed when its uid or its gid is listed.
//! The gid is the one SO_PEERCRED reports, the client's effective gid when it connected:
//! supplementary groups are not seen, so a client that reaches a group-owned socket only
//! through a supplementary group passes the file mode and is refused here (run it with that
//! group as its primary group, e.g. `sg GROUP plegd watch`).

use std::collections::BTreeSet;

/// The uids and gids allowed to use the API socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerAllowList {
    uids: BTreeSet<u32>,
    gids: BTreeSet<u32>,
}

/// How the socket file and its directory are opened for the allowed peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketAccess {
    /// The socket file's mode.
    pub socket_mode: u32,
    /// The mode of the socket's directory when plegd creates it.
    pub dir_mode: u32,
    /// The group that owns the socket and the directory plegd creates; `None`: left as is.
    pub group: Option<u32>,
}

impl PeerAllowList {
    pub fn new(uids: impl IntoIterator<Item = u32>, gids: impl IntoIterator<Item = u32>) -> Self {
        Self {
            uids: uids.into_iter().collect(),
            gids: gids.into_iter().collect(),
        }
    }

    /// Whether a peer with this uid and (effective, primary) gid may use the API.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        self.uids.contains(&uid) || self.gids.contains(&gid)
    }

    /// The narrowest modes that let every allowed peer reach a socket owned by `owner`
    /// (plegd's uid): owner only (0600 in 0700); one allowed gid: that group (0660 in 0710,
    /// group-owned by it); other uids or several gids: everyone (0666 in 0711, the directory
    /// not listable), the credential check being the only gate then.
    pub fn access(&self, owner: u32) -> SocketAccess {
        let other_uids = self.uids.iter().any(|&uid| uid != owner);
        let mut gids = self.gids.iter();
        match (other_uids, gids.next(), gids.next()) {
            (false, None, _) => SocketAccess {
                socket_mode: 0o600,
                dir_mode: 0o700,
                group: None,
            },
            (false, Some(&gid), None) => SocketAccess {
                socket_mode: 0o660,
                dir_mode: 0o710,
                group: Some(gid),
            },
            _ => SocketAccess {
                socket_mode: 0o666,
                dir_mode: 0o711,
                group: None,
            },
        }
    }
}

impl SocketAccess {
    /// Whether an existing directory with `mode` and group `gid` lets the allowed peers that
    /// are not its owner search it (reach the socket inside).
    pub fn directory_lets_peers_through(&self, mode: u32, gid: u32) -> bool {
        let others = mode & 0o001 != 0;
        match (self.socket_mode, self.group) {
            (0o600, _) => true,
            (_, Some(group)) => others || (gid == group && mode & 0o010 != 0),
            _ => others,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: u32 = 0;

    #[test]
    fn a_peer_is_allowed_by_its_uid_or_its_primary_gid() {
        let list = PeerAllowList::new([ROOT], [1000]);
        assert!(list.allows(ROOT, 5));
        assert!(list.allows(1234, 1000));
        assert!(!list.allows(1234, 5));
        assert!(!PeerAllowList::new([ROOT], []).allows(1000, ROOT));
    }

    #[test]
    fn the_modes_are_the_narrowest_that_let_every_allowed_peer_in() {
        let access = |uids: &[u32], gids: &[u32]| {
            let a = PeerAllowList::new(uids.iter().copied(), gids.iter().copied()).access(ROOT);
            (a.socket_mode, a.dir_mode, a.group)
        };
        assert_eq!(access(&[ROOT], &[]), (0o600, 0o700, None));
        assert_eq!(access(&[ROOT], &[1000]), (0o660, 0o710, Some(1000)));
        assert_eq!(access(&[], &[1000]), (0o660, 0o710, Some(1000)));
        assert_eq!(access(&[ROOT, 1000], &[]), (0o666, 0o711, None));
        assert_eq!(access(&[ROOT], &[1000, 1001]), (0o666, 0o711, None));
    }

    #[test]
    fn an_existing_directory_must_let_the_allowed_peers_through() {
        let owner_only = PeerAllowList::new([ROOT], []).access(ROOT);
        assert!(owner_only.directory_lets_peers_through(0o700, ROOT));
        let group = PeerAllowList::new([ROOT], [1000]).access(ROOT);
        assert!(group.directory_lets_peers_through(0o710, 1000));
        assert!(group.directory_lets_peers_through(0o711, ROOT));
        assert!(!group.directory_lets_peers_through(0o710, ROOT));
        assert!(!group.directory_lets_peers_through(0o700, 1000));
        let everyone = PeerAllowList::new([ROOT, 1000], []).access(ROOT);
        assert!(everyone.directory_lets_peers_through(0o711, ROOT));
        assert!(!everyone.directory_lets_peers_through(0o750, 1000));
    }
}
