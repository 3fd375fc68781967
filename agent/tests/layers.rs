//! The layer rule of `lib.rs`'s `# Layout`: the folders are the layers, and a module imports
//! only modules of its own layer or of layers below it; inside `pleg`, the same between its
//! folders, whose face (`pleg/mod.rs`) is above them all. Reads the `crate::` paths of every
//! source file (test modules and `tests.rs` files excluded) and fails naming each arrow that
//! points up.
//!
//! The same reading checks that the daemon runs no other program: no process is spawned by
//! its code (tests excluded), so what it does is all in this crate; and that the wire's crates
//! (protobuf messages, gRPC, HTTP/2) are named only at the edges, where a message is made or
//! read, so everything between carries plegd's own types.

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

/// The crates of the wire: protobuf messages (ours, CRI's, containerd's, OTLP's), gRPC and
/// the HTTP/2 under it. Also every `tonic_*` crate (health, reflection, the codec).
const WIRE_CRATES: &[&str] = &[
    "plegd_proto",
    "tonic",
    "prost",
    "prost_types",
    "k8s_cri",
    "containerd_client",
    "opentelemetry_proto",
    "hyper",
    "hyper_util",
    "h2",
    "http",
    "http_body_util",
    "tower",
    "loona_hpack",
];

fn is_wire_crate(name: &str) -> bool {
    WIRE_CRATES.contains(&name) || name.starts_with("tonic_")
}

/// Which wire crates an edge may name.
enum Allowed {
    Every,
    Only(&'static [&'static str]),
}

/// The edges, by path under `src/` (a folder ends with `/`), with why each one is: the only
/// places the wire's crates are named. A file elsewhere that names one fails
/// `wire_types_only_at_the_edges`, and so does an edge that names none any more. The fuzz
/// shims that decode wire bytes sit in the edge whose parser they drive
/// (`sources/containerd_events.rs`, `api/authority.rs`); `fuzz.rs` itself names no wire crate.
const EDGES: &[(&str, Allowed, &str)] = &[
    (
        "api/",
        Allowed::Every,
        "the plegd.v1 API: its service, listeners, conversion of plegd's types to messages and back, and the CLI's client",
    ),
    (
        "export/",
        Allowed::Every,
        "the OTLP exporter: events as OpenTelemetry log records, sent over gRPC",
    ),
    (
        "runtime/cri.rs",
        Allowed::Every,
        "the CRI backend of the Runtime port",
    ),
    (
        "runtime/containerd.rs",
        Allowed::Every,
        "the containerd backend of the Runtime port",
    ),
    (
        "runtime/tasks.rs",
        Allowed::Every,
        "containerd's task service, which both backends ask",
    ),
    (
        "runtime/transport.rs",
        Allowed::Every,
        "the gRPC dialling and call deadline the backends share, and where a gRPC status becomes the port's CallCode",
    ),
    (
        "sources/containerd_events.rs",
        Allowed::Every,
        "containerd's event stream (and the fuzz shim of its decoder)",
    ),
    (
        "sources/cri_events.rs",
        Allowed::Every,
        "CRI's GetContainerEvents stream",
    ),
    (
        "sources/reconnect.rs",
        Allowed::Every,
        "the streams' sessions: which gRPC statuses end a session for good",
    ),
    (
        "daemon/state.rs",
        Allowed::Every,
        "the saved run's file format: the event history as length-delimited plegd.v1 events",
    ),
    (
        "cli.rs",
        Allowed::Every,
        "the command line: `plegd watch --type` names plegd.v1's event types",
    ),
    (
        "config/",
        Allowed::Only(&["http"]),
        "`--otlp-endpoint` is checked at start as the URI tonic will dial (http's URI parser: no message, no transport)",
    ),
];

/// The edge `relative` (a path under `src/`) is in, if any.
fn edge_of(relative: &str) -> Option<&'static (&'static str, Allowed, &'static str)> {
    EDGES.iter().find(|(path, ..)| {
        if path.ends_with('/') {
            relative.starts_with(path)
        } else {
            relative == *path
        }
    })
}

/// The wire crates the code (not comments, not the test module) of `source` names: as the
/// first segment of a path (`tonic::Status`, `use prost::Message`, `::prost::Message`,
/// `#[derive(prost::Message)]`) or with `extern crate`.
fn wire_crates_named(source: &str) -> BTreeSet<String> {
    let code = code_of(source);
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut named = BTreeSet::new();
    for (at, _) in code.match_indices("::") {
        let before = &code[..at];
        let start = before
            .char_indices()
            .rev()
            .take_while(|(_, c)| is_ident(*c))
            .last()
            .map_or(at, |(i, _)| i);
        let name = &before[start..];
        // A path's first segment: not preceded by an identifier's `::` (`crate::http::x`).
        let head = before[..start].trim_end();
        let first = !head.ends_with("::")
            || head[..head.len() - 2]
                .chars()
                .next_back()
                .is_none_or(|c| !is_ident(c));
        if first && is_wire_crate(name) {
            named.insert(name.to_owned());
        }
    }
    for (at, _) in code.match_indices("extern crate ") {
        let rest = &code[at + "extern crate ".len()..];
        let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if is_wire_crate(&name) {
            named.insert(name);
        }
    }
    named
}

#[test]
fn wire_types_only_at_the_edges() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = files_under(&root);
    let mut misplaced = Vec::new();
    let mut edges_used = BTreeSet::new();
    for (relative, source) in &files {
        let is_test = relative
            .iter()
            .any(|part| part == "tests" || part == "tests.rs");
        if is_test {
            continue;
        }
        let relative = relative.to_string_lossy();
        let named = wire_crates_named(source);
        if named.is_empty() {
            continue;
        }
        let edge = edge_of(&relative);
        for name in &named {
            match edge {
                Some((path, Allowed::Every, _)) => {
                    edges_used.insert(*path);
                }
                Some((path, Allowed::Only(crates), _)) if crates.contains(&name.as_str()) => {
                    edges_used.insert(*path);
                }
                _ => misplaced.push(format!("{relative} names {name}")),
            }
        }
    }
    assert!(
        misplaced.is_empty(),
        "wire types below the edge (convert to plegd's own types at an edge, or name the \
         place in EDGES with why):\n{}",
        misplaced.join("\n")
    );
    let stale: Vec<&str> = EDGES
        .iter()
        .map(|(path, ..)| *path)
        .filter(|path| !edges_used.contains(path))
        .collect();
    assert!(
        stale.is_empty(),
        "edges that name no wire crate any more (drop them from EDGES): {stale:?}"
    );
}

#[test]
fn wire_crates_are_recognised_in_code_only() {
    let source = "use plegd_proto::v1 as pb;\nuse tonic::{Code, Status};\n#[derive(prost::Message)]\nstruct M;\nfn f() -> ::http::Uri { tonic_health::server::health_reporter(); todo!() }\nextern crate h2;\n";
    let found: Vec<String> = wire_crates_named(source).into_iter().collect();
    assert_eq!(
        found,
        [
            "h2",
            "http",
            "plegd_proto",
            "prost",
            "tonic",
            "tonic_health"
        ]
    );
    let clean = "use crate::api::http::Listener;\nconst URL: &str = \"http://x\";\nfn f() { my_tonic::go(); self::prost::x(); }\n// tonic::Status in a comment\n#[cfg(test)]\nmod tests { use tonic::Status; }\n";
    assert!(
        wire_crates_named(clean).is_empty(),
        "{:?}",
        wire_crates_named(clean)
    );
    assert_eq!(edge_of("api/client.rs").map(|e| e.0), Some("api/"));
    assert_eq!(
        edge_of("runtime/cri.rs").map(|e| e.0),
        Some("runtime/cri.rs")
    );
    assert!(edge_of("runtime/testing.rs").is_none());
    assert!(edge_of("base/bus.rs").is_none());
}
