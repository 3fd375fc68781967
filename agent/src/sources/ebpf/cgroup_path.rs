//! Which container a cgroup path belongs to, for every layout kubelet and the runtimes use:
//!
//! - cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`, `/kubepods/pod<uid>/<id>`
//! - systemd driver: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
//!   cri-containerd-<id>.scope` (also `crio-<id>.scope`, `docker-<id>.scope`; the uid's dashes
//!   are underscores there)
//! - containerd without a cgroup parent: `/<namespace>/<id>` for the namespaces plegd reads
//!   (`/k8s.io/<id>`, or any id in a plain namespace such as `/default/<id>`).
//!
//! Pure and total: any string gives an answer or `None`, never a panic (fuzzed).

/// The container (and pod, when the path says) a cgroup belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupOwner {
    pub container_id: String,
    pub pod_uid: Option<String>,
}

/// The cgroup crun makes inside a container's systemd scope for its processes.
const CRUN_SUBGROUP: &str = "container";

/// Scope prefixes of the systemd driver, by runtime. `crio-conmon-` scopes hold CRI-O's monitor,
/// not a container.
const SCOPE_PREFIXES: [&str; 3] = ["cri-containerd-", "crio-", "docker-"];

/// Parses `path` (relative to the cgroup2 mount, leading `/` optional). `namespaces` are the
/// containerd namespaces whose `/<namespace>/<id>` cgroups count as containers.
pub fn parse(path: &str, namespaces: &[String]) -> Option<CgroupOwner> {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let (&last, parents) = components.split_last()?;
    // crun's systemd cgroup manager runs the container in a `container` cgroup inside its
    // scope (its `run.oci.systemd.subgroup` annotation's default): the container's too, and
    // where its processes are. Only that name: a container's own sub-cgroups are not it.
    if last == CRUN_SUBGROUP && parents.last().is_some_and(|p| p.ends_with(".scope")) {
        return parse(&parents.join("/"), namespaces);
    }
    let pod_uid = parents.iter().rev().find_map(|c| pod_uid(c));

    if let Some(scope) = last.strip_suffix(".scope") {
        if scope.starts_with("crio-conmon-") {
            return None;
        }
        let id = SCOPE_PREFIXES.iter().find_map(|p| scope.strip_prefix(p))?;
        return is_runtime_id(id).then(|| CgroupOwner {
            container_id: id.to_owned(),
            pod_uid,
        });
    }
    if pod_uid.is_some() && is_runtime_id(last) {
        return Some(CgroupOwner {
            container_id: last.to_owned(),
            pod_uid,
        });
    }
    // `/<namespace>/<id>`: containerd's default for containers without a cgroup parent.
    if let [namespace] = parents
        && namespaces.iter().any(|n| n == namespace)
        && is_identifier(last)
    {
        return Some(CgroupOwner {
            container_id: last.to_owned(),
            pod_uid: None,
        });
    }
    None
}

/// Whether a path component is a pod's cgroup: `pod<uid>` (cgroupfs) or
/// `kubepods-<qos>-pod<uid>.slice` (systemd).
pub fn is_pod_cgroup(component: &str) -> bool {
    pod_uid(component).is_some()
}

/// The pod uid in a `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid>.slice` (systemd)
/// component.
fn pod_uid(component: &str) -> Option<String> {
    if let Some(slice) = component.strip_suffix(".slice") {
        let (_, uid) = slice.rsplit_once("pod")?;
        // The systemd driver writes the uid's dashes as underscores (a dash separates the
        // slice's levels): a dash here is no uid of kubelet's (found by fuzzing).
        if uid.contains('-') {
            return None;
        }
        let uid = uid.replace('_', "-");
        return is_uid(&uid).then_some(uid);
    }
    let uid = component.strip_prefix("pod")?;
    is_uid(uid).then(|| uid.to_owned())
}

/// A Kubernetes uid: hex and dashes (UUIDs), at least 8 characters. Static pods use a hash.
fn is_uid(s: &str) -> bool {
    s.len() >= 8 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// A runtime-generated container id: 64 lowercase hex characters.
fn is_runtime_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A containerd identifier (any container id made through its API).
fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 76
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const ID: &str = "0c47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77";
    const UID: &str = "3f9a2b1c-1111-4222-8333-944455556666";

    fn owner(id: &str, uid: Option<&str>) -> Option<CgroupOwner> {
        Some(CgroupOwner {
            container_id: id.to_owned(),
            pod_uid: uid.map(str::to_owned),
        })
    }

    fn namespaces() -> Vec<String> {
        vec!["k8s.io".into(), "plegd-native".into()]
    }

    #[test]
    fn cruns_subgroup_is_its_containers_and_no_other_nested_cgroup_is() {
        let uid = UID.replace('-', "_");
        let scope = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            parse(&format!("{scope}/container"), &namespaces()),
            owner(ID, Some(UID))
        );
        assert_eq!(parse(&format!("{scope}/init.scope"), &namespaces()), None);
        assert_eq!(
            parse(&format!("{scope}/container/container"), &namespaces()),
            None
        );
        assert_eq!(parse("/container", &namespaces()), None);
    }

    #[test]
    fn every_layout_names_its_container() {
        let systemd_uid = UID.replace('-', "_");
        let cases = [
            (
                format!("/kubepods/burstable/pod{UID}/{ID}"),
                owner(ID, Some(UID)),
            ),
            (format!("/kubepods/pod{UID}/{ID}"), owner(ID, Some(UID))),
            (
                format!("kubepods/besteffort/pod{UID}/{ID}"),
                owner(ID, Some(UID)),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice/cri-containerd-{ID}.scope"
                ),
                owner(ID, Some(UID)),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{systemd_uid}.slice/crio-{ID}.scope"),
                owner(ID, Some(UID)),
            ),
            (format!("/system.slice/docker-{ID}.scope"), owner(ID, None)),
            (format!("/k8s.io/{ID}"), owner(ID, None)),
            ("/plegd-native/solo".to_owned(), owner("solo", None)),
        ];
        for (path, expected) in cases {
            assert_eq!(parse(&path, &namespaces()), expected, "{path}");
        }
    }

    #[test]
    fn other_cgroups_are_not_containers() {
        for path in [
            "/".to_owned(),
            String::new(),
            "/kubepods".to_owned(),
            format!("/kubepods/burstable/pod{UID}"),
            "/kubepods.slice/kubepods-burstable.slice".to_owned(),
            format!(
                "/kubepods.slice/kubepods-pod{}.slice/crio-conmon-{ID}.scope",
                UID.replace('-', "_")
            ),
            "/system.slice/containerd.service".to_owned(),
            "/user.slice/user-0.slice/session-1.scope".to_owned(),
            format!("/other-namespace/{ID}"),
            "/k8s.io/a/b".to_owned(),
            format!("/kubepods/burstable/pod{UID}/not-an-id"),
        ] {
            assert_eq!(parse(&path, &namespaces()), None, "{path}");
        }
    }

    /// Found by fuzzing: a slice's uid with dashes and underscores became a uid spelt in
    /// neither way in the path.
    #[test]
    fn a_slice_whose_uid_has_dashes_names_no_pod() {
        let path =
            format!("/kubepods.slice/kubepods-pod0000_1111-2222.slice/cri-containerd-{ID}.scope");
        assert_eq!(parse(&path, &[]), owner(ID, None));
    }

    proptest! {
        #[test]
        fn never_panics_and_ids_come_from_the_path(path in "\\PC{0,200}") {
            if let Some(owner) = parse(&path, &namespaces()) {
                prop_assert!(path.contains(&owner.container_id));
            }
        }

        #[test]
        fn cgroupfs_paths_round_trip(id in "[0-9a-f]{64}", uid in "[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", qos in "(burstable|besteffort|guaranteed)") {
            let path = format!("/kubepods/{qos}/pod{uid}/{id}");
            prop_assert_eq!(parse(&path, &[]), owner(&id, Some(&uid)));
        }
    }
}
