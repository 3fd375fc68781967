//! OCI image tarballs built from the host's busybox-static, for a node with no registry.
//!
//! The layer holds `/bin/busybox`, one symlink per applet, `/etc/passwd` and `/etc/group`. Every
//! timestamp is fixed, so the same busybox gives the same digests on every run. Two images share
//! the layer: `localhost/busybox:latest` (for test containers) and `localhost/pause:latest` (the
//! CRI sandbox image, `sleep` forever).

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::json;
use sha2::{Digest as _, Sha256};

/// Where Debian's busybox-static installs its binary.
pub const BUSYBOX_PATH: &str = "/bin/busybox";
/// The test image, as containerd lists it after import.
pub const BUSYBOX_IMAGE: &str = "localhost/busybox:latest";
/// The CRI sandbox image.
pub const PAUSE_IMAGE: &str = "localhost/pause:latest";

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(
        "{BUSYBOX_PATH} not found or not runnable (install busybox-static: `cargo xtask setup`): {0}"
    )]
    Busybox(#[source] std::io::Error),
    #[error("{BUSYBOX_PATH} --list failed: {0}")]
    BusyboxList(String),
    #[error("writing image {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A content-addressed blob of an OCI layout.
struct Blob {
    digest: String,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Self {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        Self { digest, bytes }
    }

    fn descriptor(&self, media_type: &str) -> serde_json::Value {
        json!({ "mediaType": media_type, "digest": self.digest, "size": self.bytes.len() })
    }
}

/// The image tarballs, written to a directory.
#[derive(Clone, Debug)]
pub struct ImageTarballs {
    pub busybox: PathBuf,
    pub pause: PathBuf,
    /// The layer's diff id: also the chain id of the single-layer images (snapshot parent).
    pub layer_diff_id: String,
}

/// Builds both image tarballs into `dir` (reusing them when busybox has not changed).
pub fn build_images(dir: &Path) -> Result<ImageTarballs, ImageError> {
    let write_err = |path: &Path| {
        let path = path.to_owned();
        move |source| ImageError::Write { path, source }
    };
    fs::create_dir_all(dir).map_err(write_err(dir))?;
    let layer = Blob::new(busybox_layer()?);
    let busybox = dir.join("busybox.oci.tar");
    let pause = dir.join("pause.oci.tar");
    let images = [
        (&busybox, BUSYBOX_IMAGE, json!(["sh"])),
        (&pause, PAUSE_IMAGE, json!(["sleep", "2147483647"])),
    ];
    for (path, name, cmd) in images {
        let tarball = image_tarball(&layer, name, cmd).map_err(write_err(path))?;
        // Written to a name unique to this write and renamed, so concurrent tests (threads or
        // processes) never read a half-written tarball.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
        fs::write(&tmp, tarball).map_err(write_err(&tmp))?;
        fs::rename(&tmp, path).map_err(write_err(path))?;
    }
    Ok(ImageTarballs {
        busybox,
        pause,
        layer_diff_id: layer.digest,
    })
}

/// The uncompressed layer tar: busybox, its applet symlinks and a minimal /etc.
fn busybox_layer() -> Result<Vec<u8>, ImageError> {
    let binary = fs::read(BUSYBOX_PATH).map_err(ImageError::Busybox)?;
    let list = Command::new(BUSYBOX_PATH)
        .arg("--list")
        .output()
        .map_err(ImageError::Busybox)?;
    if !list.status.success() {
        return Err(ImageError::BusyboxList(
            String::from_utf8_lossy(&list.stderr).into_owned(),
        ));
    }
    let applets = String::from_utf8_lossy(&list.stdout).into_owned();

    let mut tar = tar::Builder::new(Vec::new());
    let io = |source| ImageError::Write {
        path: PathBuf::from("<layer>"),
        source,
    };
    for dir in ["bin", "etc", "tmp", "proc", "sys", "dev"] {
        let mut header = tar_header(
            tar::EntryType::Directory,
            if dir == "tmp" { 0o1777 } else { 0o755 },
            0,
        );
        tar.append_data(&mut header, dir, std::io::empty())
            .map_err(io)?;
    }
    let mut header = tar_header(tar::EntryType::Regular, 0o755, binary.len() as u64);
    tar.append_data(&mut header, "bin/busybox", binary.as_slice())
        .map_err(io)?;
    for applet in applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox")
    {
        let mut header = tar_header(tar::EntryType::Symlink, 0o777, 0);
        tar.append_link(&mut header, format!("bin/{applet}"), "busybox")
            .map_err(io)?;
    }
    let files: [(&str, &[u8]); 2] = [
        (
            "etc/passwd",
            b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        ),
        ("etc/group", b"root:x:0:\nnogroup:x:65534:\n"),
    ];
    for (path, content) in files {
        let mut header = tar_header(tar::EntryType::Regular, 0o644, content.len() as u64);
        tar.append_data(&mut header, path, content).map_err(io)?;
    }
    tar.into_inner().map_err(io)
}

fn tar_header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

/// One OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/*`) as a tarball that
/// `ctr images import` accepts; `name` goes into the `io.containerd.image.name` annotation.
fn image_tarball(layer: &Blob, name: &str, cmd: serde_json::Value) -> std::io::Result<Vec<u8>> {
    let config = Blob::new(serde_json::to_vec(&json!({
        "architecture": host_architecture(),
        "os": "linux",
        "config": {
            "Env": ["PATH=/bin"],
            "Cmd": cmd,
            "WorkingDir": "/",
        },
        "rootfs": { "type": "layers", "diff_ids": [layer.digest] },
    }))?);
    let manifest = Blob::new(serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config.descriptor("application/vnd.oci.image.config.v1+json"),
        "layers": [layer.descriptor("application/vnd.oci.image.layer.v1.tar")],
    }))?);
    let tag = name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    let mut manifest_descriptor = manifest.descriptor("application/vnd.oci.image.manifest.v1+json");
    manifest_descriptor["annotations"] = json!({
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": tag,
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_descriptor],
    }))?;

    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |path: &str, bytes: &[u8]| {
        let mut header = tar_header(tar::EntryType::Regular, 0o644, bytes.len() as u64);
        tar.append_data(&mut header, path, bytes)
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &index)?;
    for blob in [layer, &config, &manifest] {
        let hex = blob.digest.trim_start_matches("sha256:");
        add(&format!("blobs/sha256/{hex}"), &blob.bytes)?;
    }
    let mut out = tar.into_inner()?;
    out.flush()?;
    Ok(out)
}

/// The OCI architecture name of this machine.
fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_digest_is_sha256_of_content() {
        let blob = Blob::new(b"abc".to_vec());
        assert_eq!(
            blob.digest,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(blob.descriptor("x")["size"], 3);
    }

    #[test]
    fn image_tarball_is_a_valid_oci_layout() {
        let layer = Blob::new(b"layer".to_vec());
        let bytes = image_tarball(&layer, "localhost/x:v1", json!(["sh"])).unwrap();
        let mut archive = tar::Archive::new(bytes.as_slice());
        let mut names = Vec::new();
        let mut index = None;
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            if path == "index.json" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut entry, &mut s).unwrap();
                index = Some(serde_json::from_str::<serde_json::Value>(&s).unwrap());
            }
            names.push(path);
        }
        let index = index.expect("index.json present");
        let manifest = &index["manifests"][0];
        assert_eq!(
            manifest["annotations"]["io.containerd.image.name"],
            "localhost/x:v1"
        );
        assert_eq!(
            manifest["annotations"]["org.opencontainers.image.ref.name"],
            "v1"
        );
        let manifest_blob = format!(
            "blobs/sha256/{}",
            manifest["digest"]
                .as_str()
                .unwrap()
                .trim_start_matches("sha256:")
        );
        assert!(names.contains(&manifest_blob), "{names:?}");
        assert!(names.contains(&format!(
            "blobs/sha256/{}",
            layer.digest.trim_start_matches("sha256:")
        )));
        assert!(names.contains(&"oci-layout".to_owned()));
    }
}
