//! The names kubelet and containerd's CRI plugin give pod identity, in one place for both
//! backends: CRI sees the labels, containerd's own API sees the labels and the OCI spec
//! annotations.

/// Labels kubelet puts on every sandbox and container it creates.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
/// Set by kubelet on its containers (not on sandboxes).
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";

/// Set by the CRI plugin on every container it makes: `sandbox` or `container`.
pub const KIND_LABEL: &str = "io.cri-containerd.kind";

/// OCI spec annotations the CRI plugin sets whatever the CRI client's labels.
pub const SANDBOX_UID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-uid";
pub const SANDBOX_NAME_ANNOTATION: &str = "io.kubernetes.cri.sandbox-name";
pub const SANDBOX_NAMESPACE_ANNOTATION: &str = "io.kubernetes.cri.sandbox-namespace";
pub const CONTAINER_NAME_ANNOTATION: &str = "io.kubernetes.cri.container-name";
