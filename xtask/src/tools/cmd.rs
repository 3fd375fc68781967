//! Running commands: every failure names the command (as a shell line), its exit status and
//! its stderr.

use std::{
    ffi::OsStr,
    process::{Command, Output, Stdio},
};

use anyhow::{Context as _, Result, anyhow, bail};

/// Runs `cmd` with its output captured, whatever its exit status; fails only if it cannot start.
pub fn output(cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not run `{}`", render(cmd)))
}

/// Runs `cmd` with its output captured and returns its stdout; fails unless it exits 0.
pub fn capture(cmd: &mut Command) -> Result<String> {
    let out = output(cmd)?;
    if !out.status.success() {
        return Err(failure(cmd, &out));
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{}` printed non-UTF-8", render(cmd)))
}

/// Runs `cmd` with its output shown as it goes (long installs); fails unless it exits 0.
pub fn stream(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("could not run `{}`", render(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status}); its output is above", render(cmd));
    }
    Ok(())
}

pub fn failure(cmd: &Command, out: &Output) -> anyhow::Error {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr = stderr.trim();
    if stderr.is_empty() {
        anyhow!("`{}` failed ({})", render(cmd), out.status)
    } else {
        anyhow!("`{}` failed ({}): {stderr}", render(cmd), out.status)
    }
}

/// `cmd` as a shell line: the environment it sets, the program, the arguments.
pub fn render(cmd: &Command) -> String {
    let envs = cmd.get_envs().filter_map(|(key, value)| {
        value.map(|v| format!("{}={}", key.to_string_lossy(), quote(v)))
    });
    let words = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(quote);
    envs.chain(words).collect::<Vec<_>>().join(" ")
}

/// `word` quoted for a POSIX shell when it needs to be.
pub fn quote(word: &OsStr) -> String {
    let word = word.to_string_lossy();
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=,+@%".contains(c));
    if plain {
        word.into_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_quotes_what_the_shell_would_mangle() {
        let mut cmd = Command::new("dpkg-query");
        cmd.args(["-W", "-f=${Package}\t${Status}\n", "it's", ""])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22");
        assert_eq!(
            render(&cmd),
            "LLVM_PREFIX=/usr/lib/llvm-22 dpkg-query -W '-f=${Package}\t${Status}\n' \
             'it'\\''s' ''"
        );
    }

    #[test]
    fn failing_command_names_itself_its_status_and_stderr() {
        let err = capture(Command::new("sh").args(["-c", "echo oops >&2; exit 3"])).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("`sh -c 'echo oops >&2; exit 3'`"), "{msg}");
        assert!(msg.contains("exit status: 3"), "{msg}");
        assert!(msg.contains("oops"), "{msg}");
    }

    #[test]
    fn missing_program_is_an_error_not_a_panic() {
        let err = capture(&mut Command::new("/nonexistent/plegd-xtask-test")).unwrap_err();
        assert!(format!("{err:#}").starts_with("could not run `/nonexistent/plegd-xtask-test`"));
    }
}
