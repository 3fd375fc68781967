//! docs/configuration.md: every setting of `plegd run` from its clap definition.

use std::fmt::Write as _;

use clap::Arg;
use plegd::config::RunArgs;

/// The TOML key of the flag `long`, as the file parser knows it (`None`: flags and
/// environment only), asked of the parser itself: `deny_unknown_fields` names unknown keys.
fn file_key(long: &str) -> Option<String> {
    let error = toml::from_str::<RunArgs>(&format!("{long} = {{}}"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    (!error.contains("unknown field")).then(|| long.to_owned())
}

/// The flag's help, ended as a sentence (clap drops the period of one-paragraph helps).
fn help(arg: &Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string().trim().to_owned())
        .unwrap_or_default();
    match help.chars().last() {
        Some('.' | ']' | ')' | ':') | None => help,
        Some(_) => format!("{help}."),
    }
}

fn default(arg: &Arg) -> Option<String> {
    let values = arg.get_default_values();
    (!values.is_empty()).then(|| {
        values
            .iter()
            .map(|v| v.to_string_lossy())
            .collect::<Vec<_>>()
            .join(",")
    })
}

pub fn reference() -> String {
    let cli = plegd::cli::command();
    let run = cli
        .get_subcommands()
        .find(|c| c.get_name() == "run")
        .expect("plegd run");
    let args: Vec<&Arg> = run
        .get_arguments()
        .filter(|a| a.get_long().is_some() && !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    let mut out = super::banner("`RunArgs` in agent/src/config.rs (clap)");
    out.push_str(
        "\n# `plegd run` configuration\n\n\
         Each setting is a flag, a `PLEGD_*` environment variable and a key of the TOML file \
         named by `--config`. A flag beats its variable, which beats the file, which beats the \
         default. File keys are the flag names; durations are written as in flags (`\"500ms\"`, \
         `\"1h 30m\"`), lists as TOML arrays (`sources = [\"ebpf\", \"containerd\"]`).\n\n\
         | Flag | Environment | File key | Default |\n|---|---|---|---|\n",
    );
    for arg in &args {
        let long = arg.get_long().unwrap();
        let value = arg
            .get_value_names()
            .map(|names| format!(" <{}>", names.join(" ")))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| [`--{long}{}`](#{long}) | {} | {} | {} |",
            value.replace('|', "\\|"),
            arg.get_env()
                .map_or("".into(), |e| format!("`{}`", e.to_string_lossy())),
            file_key(long).map_or("(flag and environment only)".into(), |k| format!("`{k}`")),
            default(arg).map_or("(none)".into(), |d| format!("`{d}`")),
        );
    }
    for arg in &args {
        let long = arg.get_long().unwrap();
        let _ = write!(out, "\n## `{long}`\n\n{}\n", help(arg));
        let values: Vec<_> = arg
            .get_possible_values()
            .into_iter()
            .filter(|v| !v.is_hide_set())
            .collect();
        // Booleans list true/false: nothing to say about them.
        if !values.is_empty() && !values.iter().any(|v| v.get_name() == "true") {
            out.push_str("\nValues:\n\n");
            for value in values {
                let _ = match value.get_help() {
                    Some(help) => writeln!(
                        out,
                        "- `{}`: {}",
                        value.get_name(),
                        super::cell(&help.to_string())
                    ),
                    None => writeln!(out, "- `{}`", value.get_name()),
                };
            }
        }
        let _ = writeln!(
            out,
            "\nFlag `--{long}`{}{}{}.",
            arg.get_env().map_or(String::new(), |e| format!(
                ", environment `{}`",
                e.to_string_lossy()
            )),
            file_key(long).map_or(String::new(), |k| format!(", file key `{k}`")),
            default(arg).map_or(String::new(), |d| format!(", default `{d}`")),
        );
    }
    out
}
