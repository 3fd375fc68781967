//! The layer rule of `lib.rs`'s `# Layout`: a module imports only modules of its own layer or
//! of layers below it. Reads the `crate::` paths of every source file (test modules excluded)
//! and fails naming each arrow that points up.
//!
//! The same reading checks that the daemon runs no other program: no process is spawned by
//! its code (tests excluded), so what it does is all in this crate.

use std::{collections::BTreeSet, path::Path};

/// The layers, lowest first, as `lib.rs` lists them. `pleg` is split by file: its types sit
/// at the bottom, its relist and generator above the runtime.
const LAYERS: &[&[&str]] = &[
    &[
        "pleg::record",
        "pleg::event",
        "backoff",
        "capabilities",
        "heap",
    ],
    &[
        "metrics",
        "bus",
        "pleg::diff",
        "pleg::cache",
        "pleg::health",
        "pleg::hints",
        "pleg::merge",
        "pleg::committed",
        "pleg::reconcile",
        "pleg::scheduler",
        "pleg::provenance",
        "pleg::sink",
    ],
    &["runtime"],
    &["pleg::relist", "pleg::generator"],
    &["sources"],
    &["output", "sync_loop", "state"],
    &["config", "fuzz"],
    &["api"],
    &["daemon", "check"],
    &["cli"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The module a source file belongs to: `pleg::<file>` inside `pleg`, else its top directory
/// or file. `None` for the crate root and `pleg/mod.rs`, which only declare modules.
fn module_of(relative: &Path) -> Option<String> {
    let parts: Vec<String> = relative
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [root] if root == "lib" || root == "main" => None,
        [pleg, file] if pleg == "pleg" => (file != "mod").then(|| format!("pleg::{file}")),
        [top, ..] => Some(top.clone()),
        [] => None,
    }
}

/// The module a `crate::` path names: `pleg::<item>` inside `pleg`, else its first segment.
fn target_of(path: &str) -> String {
    let mut segments = path.split("::").map(str::trim);
    let first = segments.next().unwrap_or_default();
    match (first, segments.next()) {
        ("pleg", Some(second)) => format!("pleg::{second}"),
        _ => first.to_owned(),
    }
}

/// `source` without its test module and comment lines.
fn code_of(source: &str) -> String {
    source
        .lines()
        .take_while(|line| line.trim() != "#[cfg(test)]")
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every module the code (not comments) of `source` names through `crate::`, expanding
/// `crate::{a::b, c::{d, e}}` groups at their first level, and `pleg::{x, y}` one deeper.
fn imports(source: &str) -> BTreeSet<String> {
    let code = code_of(source);
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        for path in expand(rest) {
            found.insert(target_of(&path));
        }
    }
    found
}

/// The paths a `use` tree starting at `rest` names, down to the second segment.
fn expand(rest: &str) -> Vec<String> {
    let ident_end = |s: &str| {
        s.find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    };
    if let Some(group) = rest.strip_prefix('{') {
        return split_group(group)
            .into_iter()
            .flat_map(|entry| expand(entry.trim()))
            .collect();
    }
    let end = ident_end(rest);
    let first = &rest[..end];
    if first.is_empty() {
        return Vec::new();
    }
    let after = &rest[end..];
    match after.strip_prefix("::") {
        Some(next) if first == "pleg" => match next.strip_prefix('{') {
            Some(group) => split_group(group)
                .into_iter()
                .map(|entry| {
                    let entry = entry.trim();
                    format!("pleg::{}", &entry[..ident_end(entry)])
                })
                .collect(),
            None => vec![format!("pleg::{}", &next[..ident_end(next)])],
        },
        _ => vec![first.to_owned()],
    }
}

/// The top-level, comma-separated entries of a `{...}` group whose opening brace is consumed.
fn split_group(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut entries) = (0usize, 0usize, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                entries.push(&group[start..i]);
                return entries
                    .into_iter()
                    .filter(|e| !e.trim().is_empty())
                    .collect();
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    entries
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_a_module_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    let mut upward = Vec::new();
    let mut checked = 0;
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap();
        let Some(module) = module_of(relative) else {
            continue;
        };
        let own = layer_of(&module)
            .unwrap_or_else(|| panic!("{module} ({}) is in no layer", relative.display()));
        for target in imports(&std::fs::read_to_string(file).unwrap()) {
            if target == module {
                continue;
            }
            let Some(layer) = layer_of(&target) else {
                panic!(
                    "{} imports {target}, which is in no layer",
                    relative.display()
                );
            };
            checked += 1;
            if layer > own {
                upward.push(format!(
                    "{} ({module}) imports {target}",
                    relative.display()
                ));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} imports found: is the parser broken?"
    );
    assert!(
        upward.is_empty(),
        "imports pointing up:\n{}",
        upward.join("\n")
    );
}

/// Inside `runtime`, its files by layer, lowest first: the trait and its types (`mod.rs`, which
/// also declares and re-exports the rest, so its own imports are not checked) with the label
/// names; the gRPC transport; containerd's task service; the CRI backend and the fake; the containerd backend (which asks
/// CRI on the same socket); the choice of backend.
const RUNTIME_LAYERS: &[&[&str]] = &[
    &["mod", "labels"],
    &["transport"],
    &["tasks"],
    &["cri", "testing"],
    &["containerd"],
    &["choice"],
];

fn runtime_layer_of(file: &str) -> Option<usize> {
    RUNTIME_LAYERS
        .iter()
        .position(|layer| layer.contains(&file))
}

#[test]
fn runtime_files_import_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/runtime");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    let mut upward = Vec::new();
    for file in &files {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "mod" {
            continue;
        }
        let own = runtime_layer_of(&name)
            .unwrap_or_else(|| panic!("runtime/{name}.rs is in no runtime layer"));
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        for (at, _) in code.match_indices("crate::runtime::") {
            for item in expand(&code[at + "crate::runtime::".len()..]) {
                // An item that is no file (`Runtime`, `RuntimeError`, ...) is `mod.rs`'s.
                let target = if runtime_layer_of(&item).is_some() {
                    item
                } else {
                    "mod".to_owned()
                };
                if runtime_layer_of(&target).unwrap() > own {
                    upward.push(format!("runtime/{name}.rs imports runtime::{target}"));
                }
            }
        }
    }
    assert!(
        files.len() >= RUNTIME_LAYERS.concat().len(),
        "runtime files: {files:?}"
    );
    assert!(
        upward.is_empty(),
        "runtime imports pointing up:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_parser_finds_grouped_and_nested_paths() {
    let source = "use crate::{\n    api::{self, ApiBus},\n    pleg::{cache::PodCache, event::{Scope, Trigger}},\n    runtime::Runtime,\n};\n// crate::cli in a comment\nfn f() { crate::metrics::Metrics::new(); }\n#[cfg(test)]\nmod tests { use crate::daemon; }\n";
    let found: Vec<String> = imports(source).into_iter().collect();
    assert_eq!(
        found,
        ["api", "metrics", "pleg::cache", "pleg::event", "runtime"]
    );
}

/// What starting another program looks like in Rust source: std's and tokio's `Command`
/// (named in full or imported from a `process::{...}` group), and the raw calls.
fn spawns_processes(source: &str) -> Vec<String> {
    let code = code_of(source);
    let mut found: Vec<String> = [
        "process::Command",
        "tokio::process",
        "fork(",
        "execv",
        "posix_spawn",
        "pidfd_spawn",
    ]
    .into_iter()
    .filter(|needle| code.contains(needle))
    .map(str::to_owned)
    .collect();
    for (at, _) in code.match_indices("process::{") {
        let group = &code[at + "process::{".len()..];
        let group = &group[..group.find('}').unwrap_or(group.len())];
        if group
            .split(',')
            .any(|item| item.trim().starts_with("Command"))
        {
            found.push(format!("process::{{{group}}}"));
        }
    }
    found
}

#[test]
fn the_daemon_spawns_no_process() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 20, "only {} source files found", files.len());
    let spawning: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let relative = file.strip_prefix(&root).unwrap().display().to_string();
            spawns_processes(&std::fs::read_to_string(file).unwrap())
                .into_iter()
                .map(move |what| format!("{relative}: {what}"))
        })
        .collect();
    assert!(
        spawning.is_empty(),
        "the daemon must not run other programs:\n{}",
        spawning.join("\n")
    );
}

#[test]
fn process_spawning_is_recognised_outside_tests_only() {
    let spawning = "use std::process::{ExitCode, Command};\nfn f() { tokio::process::Command::new(\"sh\"); }\n";
    assert_eq!(
        spawns_processes(spawning),
        [
            "process::Command",
            "tokio::process",
            "process::{ExitCode, Command}"
        ]
    );
    let clean = "use std::process::ExitCode;\nfn f() { clap::Command::new(\"run\"); }\n// std::process::Command in a comment\n#[cfg(test)]\nmod tests { fn t() { std::process::Command::new(\"true\"); } }\n";
    assert!(spawns_processes(clean).is_empty());
}
