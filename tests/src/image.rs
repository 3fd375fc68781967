//! OCI image tarballs built locally, for a node with no registry: busybox images for the tests'
//! containers, and an image of one dynamically linked program with the shared libraries it
//! needs ([`build_program_image`]: plegd's, for `cargo xtask image` and the DaemonSet test).
//!
//! The busybox layer holds `/bin/busybox`, one symlink per applet, `/etc/passwd` and `/etc/group`. Every
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

/// The name `cargo xtask image` gives plegd's image: the DaemonSet's `image`
/// (deploy/kubernetes/daemonset.yaml; tests/tests/deploy.rs checks they agree).
pub const PLEGD_IMAGE: &str = concat!("localhost/plegd:", env!("CARGO_PKG_VERSION"));

/// Where plegd's image installs it (its entrypoint).
pub const PLEGD_IN_IMAGE: &str = "/usr/local/bin/plegd";

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(
        "{BUSYBOX_PATH} not found or not runnable (install busybox-static: `cargo xtask setup`): {0}"
    )]
    Busybox(#[source] std::io::Error),
    #[error("{BUSYBOX_PATH} --list failed: {0}")]
    BusyboxList(String),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("ldd {program}: {detail}")]
    Ldd { program: PathBuf, detail: String },
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
        let config = json!({ "Env": ["PATH=/bin"], "Cmd": cmd, "WorkingDir": "/" });
        let tarball = image_tarball(&layer, name, config).map_err(write_err(path))?;
        write_atomically(path, &tarball)?;
    }
    Ok(ImageTarballs {
        busybox,
        pause,
        layer_diff_id: layer.digest,
    })
}

/// Writes to a name unique to this write and renames, so concurrent tests (threads or
/// processes) never read a half-written tarball.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let write_err = |path: &Path| {
        let path = path.to_owned();
        move |source| ImageError::Write { path, source }
    };
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    fs::write(&tmp, bytes).map_err(write_err(&tmp))?;
    fs::rename(&tmp, path).map_err(write_err(path))
}

/// An image of one program: what [`build_program_image`] puts in it.
#[derive(Clone, Debug)]
pub struct ProgramImage<'a> {
    /// The program on this machine.
    pub program: &'a Path,
    /// Where it goes in the image (absolute), the image's entrypoint.
    pub install_as: &'a str,
    /// The image's name, e.g. `localhost/plegd:0.1.0`.
    pub name: &'a str,
    /// The image's default arguments.
    pub cmd: &'a [&'a str],
    /// Empty directories the program expects (absolute), e.g. mount points.
    pub dirs: &'a [&'a str],
}

/// A built program image: the tarball and what is in it.
#[derive(Clone, Debug)]
pub struct BuiltImage {
    pub tarball: PathBuf,
    /// Its size in bytes (uncompressed: the layer is a plain tar).
    pub size: u64,
    /// The shared libraries copied in, as `ldd` named them.
    pub libraries: Vec<PathBuf>,
}

/// Builds `image` into the OCI tarball `out`: one layer with the program, the shared
/// libraries `ldd` says it loads (at the paths it names, so the dynamic loader finds them with
/// no cache), `/tmp`, `image.dirs` and a minimal `/etc/passwd`. Nothing else: no shell.
pub fn build_program_image(image: &ProgramImage<'_>, out: &Path) -> Result<BuiltImage, ImageError> {
    let read = |path: &Path| {
        fs::read(path).map_err(|source| ImageError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let libraries = shared_libraries(image.program)?;
    let mut files = vec![(image.install_as.to_owned(), read(image.program)?, 0o755)];
    for library in &libraries {
        files.push((library.display().to_string(), read(library)?, 0o755));
    }
    files.push((
        "/etc/passwd".into(),
        b"root:x:0:0:root:/:/sbin/nologin\n".to_vec(),
        0o644,
    ));
    files.push(("/etc/group".into(), b"root:x:0:\n".to_vec(), 0o644));
    let io = |source| ImageError::Write {
        path: out.to_owned(),
        source,
    };
    let layer = Blob::new(files_layer(&files, image.dirs).map_err(io)?);
    let config = json!({
        "Entrypoint": [image.install_as],
        "Cmd": image.cmd,
        "WorkingDir": "/",
    });
    let tarball = image_tarball(&layer, image.name, config).map_err(io)?;
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir).map_err(io)?;
    }
    write_atomically(out, &tarball)?;
    Ok(BuiltImage {
        tarball: out.to_owned(),
        size: tarball.len() as u64,
        libraries,
    })
}

/// Builds plegd's image from `binary` into `out`, named `name`: [`PLEGD_IN_IMAGE`] as the
/// entrypoint, `run` as the default arguments, the mount points of the DaemonSet made.
pub fn build_plegd_image(binary: &Path, name: &str, out: &Path) -> Result<BuiltImage, ImageError> {
    build_program_image(
        &ProgramImage {
            program: binary,
            install_as: PLEGD_IN_IMAGE,
            name,
            cmd: &["run"],
            dirs: &[
                "/proc",
                "/sys",
                "/dev",
                "/run/plegd",
                "/run/containerd",
                "/var/lib/plegd",
            ],
        },
        out,
    )
}

/// The shared libraries `program` loads, as `ldd` lists them (the vDSO excluded).
fn shared_libraries(program: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let ldd_err = |detail: String| ImageError::Ldd {
        program: program.to_owned(),
        detail,
    };
    let output = Command::new("ldd")
        .arg(program)
        .output()
        .map_err(|e| ldd_err(e.to_string()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let said = format!("{text}{}", String::from_utf8_lossy(&output.stderr));
    // A static program: ldd says so (on stdout or stderr) and may fail.
    if said.contains("statically linked") || said.contains("not a dynamic executable") {
        return Ok(Vec::new());
    }
    if !output.status.success() {
        return Err(ldd_err(
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }
    parse_ldd(&text).map_err(ldd_err)
}

/// The library paths of `ldd`'s output; a library it could not find is an error.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut libraries = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = match line.split_once("=>") {
            Some((name, target)) => {
                let target = target.trim();
                if target.starts_with("not found") {
                    return Err(format!("{} not found", name.trim()));
                }
                target.split(" (").next().unwrap_or_default().trim()
            }
            None => line.split(" (").next().unwrap_or_default().trim(),
        };
        if path.starts_with('/') {
            libraries.push(PathBuf::from(path));
        }
    }
    Ok(libraries)
}

/// A layer of `(absolute path, content, mode)` files and empty `dirs`, every parent directory
/// made first.
fn files_layer(files: &[(String, Vec<u8>, u32)], dirs: &[&str]) -> std::io::Result<Vec<u8>> {
    let mut all_dirs = std::collections::BTreeSet::new();
    let mut add_parents = |path: &str| {
        let mut at = Path::new(path.trim_start_matches('/'));
        while let Some(parent) = at.parent().filter(|p| !p.as_os_str().is_empty()) {
            all_dirs.insert(parent.to_owned());
            at = parent;
        }
    };
    for (path, _, _) in files {
        add_parents(path);
    }
    for dir in dirs.iter().chain(&["/tmp"]) {
        add_parents(&format!("{dir}/x"));
    }
    let mut tar = tar::Builder::new(Vec::new());
    // Sorted: parents come before their children.
    for dir in &all_dirs {
        let mode = if dir == Path::new("tmp") {
            0o1777
        } else {
            0o755
        };
        let mut header = tar_header(tar::EntryType::Directory, mode, 0);
        tar.append_data(&mut header, dir, std::io::empty())?;
    }
    for (path, content, mode) in files {
        let mut header = tar_header(tar::EntryType::Regular, *mode, content.len() as u64);
        tar.append_data(
            &mut header,
            path.trim_start_matches('/'),
            content.as_slice(),
        )?;
    }
    tar.into_inner()
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
/// `config` is the image config's `config` (Entrypoint, Cmd, Env, ...).
fn image_tarball(layer: &Blob, name: &str, config: serde_json::Value) -> std::io::Result<Vec<u8>> {
    let config = Blob::new(serde_json::to_vec(&json!({
        "architecture": host_architecture(),
        "os": "linux",
        "config": config,
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
    fn ldd_output_gives_every_library_path() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f0a)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0b)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f0c)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn a_program_image_holds_the_program_its_libraries_and_parents() {
        let dir = tempfile::tempdir().unwrap();
        let program = Path::new(BUSYBOX_PATH);
        let image = ProgramImage {
            program,
            install_as: "/usr/local/bin/tool",
            name: "localhost/tool:1",
            cmd: &["--help"],
            dirs: &["/run/tool"],
        };
        let built = build_program_image(&image, &dir.path().join("tool.tar")).unwrap();
        let mut outer = tar::Archive::new(fs::File::open(&built.tarball).unwrap());
        let mut layer_paths = Vec::new();
        for entry in outer.entries().unwrap() {
            let mut entry = entry.unwrap();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
            // The layer is the blob that is itself a tar holding the program.
            if let Ok(entries) = tar::Archive::new(bytes.as_slice()).entries() {
                let paths: Vec<String> = entries
                    .filter_map(|e| Some(e.ok()?.path().ok()?.display().to_string()))
                    .collect();
                if paths.iter().any(|p| p == "usr/local/bin/tool") {
                    layer_paths = paths;
                }
            }
        }
        for want in [
            "usr/",
            "usr/local/",
            "usr/local/bin/",
            "run/tool/",
            "tmp/",
            "etc/passwd",
        ] {
            assert!(
                layer_paths
                    .iter()
                    .any(|p| p.trim_end_matches('/') == want.trim_end_matches('/')),
                "{want} missing from {layer_paths:?}"
            );
        }
        for library in &built.libraries {
            let inside = library.display().to_string();
            assert!(
                layer_paths.contains(&inside.trim_start_matches('/').to_owned()),
                "{inside} missing"
            );
        }
    }

    #[test]
    fn image_tarball_is_a_valid_oci_layout() {
        let layer = Blob::new(b"layer".to_vec());
        let bytes = image_tarball(&layer, "localhost/x:v1", json!({ "Cmd": ["sh"] })).unwrap();
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
