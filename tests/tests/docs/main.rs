//! The reference pages under docs/ are generated from the code, so they cannot drift: this
//! test regenerates them and fails when the checked-in files differ. `cargo xtask docs` runs
//! it with `PLEGD_WRITE_DOCS=1`, which writes them instead.
//!
//! - docs/configuration.md: `plegd run`'s settings, from its clap definition (`RunArgs`).
//! - docs/man/*.1: man pages of `plegd` and each subcommand (clap_mangen).
//! - docs/api.md: the plegd.v1 API, from the .proto and its comments (protox, source info).
//! - docs/metrics.md: every metric, from the registry (`Metrics::new()`).

mod api;
mod config;
mod links;
mod metrics;

use std::path::{Path, PathBuf};

/// Set, the test writes docs/ instead of comparing it (xtask/src/docs.rs sets it).
const WRITE_ENV: &str = "PLEGD_WRITE_DOCS";

/// The command that regenerates docs/.
const REGENERATE: &str = "cargo xtask docs";

/// Where generated pages say they come from.
pub fn banner(source: &str) -> String {
    format!(
        "<!-- Generated from {source} by `{REGENERATE}`; do not edit: `cargo test` fails \
         when this file and the code disagree. -->\n"
    )
}

fn docs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

/// Every generated file: its path under docs/ and its content.
fn generated() -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = vec![
        (
            PathBuf::from("configuration.md"),
            config::reference().into_bytes(),
        ),
        (PathBuf::from("api.md"), api::reference().into_bytes()),
        (
            PathBuf::from("metrics.md"),
            metrics::reference().into_bytes(),
        ),
    ];
    files.extend(man_pages());
    files
}

/// `plegd.1` and `plegd-<subcommand>.1` for each subcommand.
fn man_pages() -> Vec<(PathBuf, Vec<u8>)> {
    // Values of PLEGD_* variables in this environment must not end up in the pages.
    let command =
        plegd::cli::command().mut_subcommands(|sub| sub.mut_args(|a| a.hide_env_values(true)));
    let dir = tempfile::tempdir().unwrap();
    clap_mangen::generate_to(command, dir.path()).unwrap();
    let mut pages: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = PathBuf::from("man").join(path.file_name().unwrap());
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    pages.sort();
    pages
}

#[test]
fn checked_in_docs_match_the_code() {
    let write = std::env::var_os(WRITE_ENV).is_some();
    let docs = docs_dir();
    let files = generated();
    let mut stale = Vec::new();
    for (path, content) in &files {
        let full = docs.join(path);
        if std::fs::read(&full).ok().as_ref() == Some(content) {
            continue;
        }
        if write {
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, content).unwrap();
            eprintln!("wrote docs/{}", path.display());
        } else {
            stale.push(path.display().to_string());
        }
    }
    // Man pages of subcommands that no longer exist.
    for entry in std::fs::read_dir(docs.join("man")).into_iter().flatten() {
        let name = PathBuf::from("man").join(entry.unwrap().file_name());
        if !files.iter().any(|(path, _)| *path == name) {
            if write {
                std::fs::remove_file(docs.join(&name)).unwrap();
                eprintln!("removed docs/{}", name.display());
            } else {
                stale.push(format!("{} (no longer generated)", name.display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "docs/ is out of date with the code: {}.\nRegenerate with `{REGENERATE}` and commit.",
        stale.join(", ")
    );
}

/// One Markdown table cell: on one line, pipes escaped.
pub fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}
