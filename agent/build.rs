use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

/// Builds `plegd-ebpf` for bpfel-unknown-none with the nightly toolchain; the object lands in
/// `OUT_DIR/plegd` and is embedded by `sources::ebpf` with `include_bytes_aligned!`.
fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "plegd-ebpf")
        .ok_or_else(|| anyhow!("plegd-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )
    .context("building the eBPF programs (is `cargo xtask setup` done? it installs bpf-linker and nightly rust-src)")
}
