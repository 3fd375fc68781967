//! The layer rule of `lib.rs`'s `# Layout`: the folders are the layers, and a module imports
//! only modules of its own layer or of layers below it; inside `pleg`, the same between its
//! folders, whose face (`pleg/mod.rs`) is above them all. Reads the `crate::` paths of every
//! source file (test modules and `tests.rs` files excluded) and fails naming each arrow that
//! points up.
//!
//! The same reading checks that the daemon runs no other program: no process is spawned by
//! its code (tests excluded), so what it does is all in this crate.

use std::{collections::BTreeSet, path::Path};

/// The layers, lowest first, as `lib.rs` lists them: each a folder or a file of `src/`.
const LAYERS: &[&[&str]] = &[
    &["base"],
    &["pleg"],
    &["runtime", "sources"],
    &["output"],
    &["config"],
    &["api", "export", "fuzz"],
    &["daemon"],
    &["cli"],
];

/// Inside `pleg`, its folders by layer, lowest first; `mod` is its face.
const PLEG_LAYERS: &[&[&str]] = &[
    &["model"],
    &["decide", "shared"],
    &["driver", "sync_loop"],
    &["mod"],
];

fn layer_of(layers: &[&[&str]], module: &str) -> Option<usize> {
    layers.iter().position(|layer| layer.contains(&module))
}

/// The first folder or file of `relative` (a path under `src/` or `src/pleg/`), without its
/// extension; `None` for a test file and for the crate root.
fn module_of(relative: &Path) -> Option<String> {
    if relative.file_name().is_some_and(|name| name == "tests.rs") {
        return None;
    }
    let first = relative
        .with_extension("")
        .iter()
        .next()?
        .to_string_lossy()
        .into_owned();
    (first != "lib" && first != "main").then_some(first)
}

/// The module of `src/` a path names: its first segment.
fn target_of(path: &str) -> &str {
    path.split("::").next().unwrap_or_default()
}

/// What a path names inside the PLEG: its folder, or `mod` (the face) for what the face
/// re-exports; `None` for a path out of the PLEG.
fn pleg_target_of(path: &str) -> Option<&str> {
    let inside = path.strip_prefix("pleg::")?;
    Some(match layer_of(PLEG_LAYERS, inside) {
        Some(_) => inside,
        None => "mod",
    })
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

/// Every path the code (not comments) of `source` names through `crate::`, expanding
/// `crate::{a::b, c::{d, e}}` groups at their first level, and `pleg::{x, y}` one deeper: the
/// module (`base`), or `pleg::` and what it names inside the PLEG (`pleg::model`).
fn imports(source: &str) -> BTreeSet<String> {
    let code = code_of(source);
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        found.extend(expand(&code[at + "crate::".len()..]));
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

/// Every source file under `dir`, with its path relative to it.
fn files_under(dir: &Path) -> Vec<(std::path::PathBuf, String)> {
    let mut files = Vec::new();
    sources(dir, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(dir).unwrap().to_owned();
            let source = std::fs::read_to_string(&file).unwrap();
            (relative, source)
        })
        .collect()
}

/// The arrows of `files` that point up in `layers`, where `module_of` and `target_of` place
/// a file and what it names; with the count of arrows checked.
fn upward_arrows(
    files: &[(std::path::PathBuf, String)],
    layers: &[&[&str]],
    target_of: impl Fn(&str) -> Option<String>,
) -> (Vec<String>, usize) {
    let mut upward = Vec::new();
    let mut checked = 0;
    for (relative, source) in files {
        let Some(module) = module_of(relative) else {
            continue;
        };
        let own = layer_of(layers, &module)
            .unwrap_or_else(|| panic!("{module} ({}) is in no layer", relative.display()));
        for target in imports(source).iter().filter_map(|path| target_of(path)) {
            if target == module {
                continue;
            }
            let Some(layer) = layer_of(layers, &target) else {
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
    (upward, checked)
}

#[test]
fn no_module_imports_a_module_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = files_under(&root);
    let (upward, checked) = upward_arrows(&files, LAYERS, |path| Some(target_of(path).to_owned()));
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

/// Inside the PLEG, its folders import one way, and only its face imports through itself:
/// a folder that named what the face re-exports would import the face above it.
#[test]
fn pleg_folders_import_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/pleg");
    let files = files_under(&root);
    let (upward, checked) = upward_arrows(&files, PLEG_LAYERS, |path| {
        pleg_target_of(path).map(str::to_owned)
    });
    assert!(checked > 15, "only {checked} imports found inside the PLEG");
    assert!(
        upward.is_empty(),
        "imports pointing up inside the PLEG:\n{}",
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
    assert_eq!(pleg_target_of("pleg::decide"), Some("decide"));
    assert_eq!(pleg_target_of("pleg::Trigger"), Some("mod"));
    assert_eq!(pleg_target_of("runtime"), None);
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
