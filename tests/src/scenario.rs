//! The setup most end-to-end tests share: a private containerd with a CRI client and a tasks
//! client on its CRI namespace.

use crate::{
    ContainerdOptions, PrivateContainerd, containerd::CRI_NAMESPACE, cri::Cri, native::Native,
};

/// A private containerd and the clients a test drives it with.
pub struct Node {
    pub containerd: PrivateContainerd,
    /// Pods and containers, as kubelet makes them.
    pub cri: Cri,
    /// containerd's task API in the CRI namespace: init pids, kills.
    pub tasks: Native,
}

impl Node {
    /// A node on a containerd of its own ([`ContainerdOptions::unique`]).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(&ContainerdOptions::unique()).await
    }

    pub async fn start_with(options: &ContainerdOptions) -> anyhow::Result<Self> {
        let containerd = PrivateContainerd::start(options).await?;
        let cri = Cri::connect(&containerd).await?;
        let tasks = Native::connect_in(&containerd, CRI_NAMESPACE).await?;
        Ok(Self {
            containerd,
            cri,
            tasks,
        })
    }
}
