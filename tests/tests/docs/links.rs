//! Links between README.md and the pages under docs/: every relative link names a file that
//! exists, and every `#anchor` a heading of the page it points into, so moving a section
//! cannot leave a dead link behind.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

/// README.md and every Markdown page under docs/.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The text outside fenced code blocks.
fn prose(markdown: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    markdown.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// A heading's anchor as GitHub makes it: lower case, spaces to hyphens, punctuation dropped.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    prose(markdown)
        .filter(|line| line.starts_with('#'))
        .filter_map(|line| line.trim_start_matches('#').strip_prefix(' '))
        .map(anchor)
        .collect()
}

/// The targets of inline links `[text](target)` outside code.
fn links(markdown: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(markdown) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            targets.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    targets
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    for (heading, expected) in [
        ("Kernel probes (eBPF)", "kernel-probes-ebpf"),
        (
            "Confirmation: the runtime's task record, or its CRI store",
            "confirmation-the-runtimes-task-record-or-its-cri-store",
        ),
        (
            "Other kernels: `cargo xtask kernels`",
            "other-kernels-cargo-xtask-kernels",
        ),
    ] {
        assert_eq!(anchor(heading), expected);
    }
    assert_eq!(
        links("see [a](docs/a.md#b) and [c](#d), `[not](code)`?\n```\n[x](y)\n```"),
        ["docs/a.md#b", "#d", "code"]
    );
}

#[test]
fn every_relative_link_resolves() {
    let mut dead = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let linked = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            let name = page.file_name().unwrap().to_string_lossy();
            if !linked.exists() {
                dead.push(format!("{name}: {target} (no such file)"));
                continue;
            }
            if !fragment.is_empty() {
                let linked_text = std::fs::read_to_string(&linked).unwrap_or_default();
                if !anchors(&linked_text).contains(fragment) {
                    dead.push(format!("{name}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}
