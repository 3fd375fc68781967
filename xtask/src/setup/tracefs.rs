//! tracefs, mounted where the agent's tracepoints are.

use std::{fs, io::ErrorKind, path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use super::{
    Options,
    summary::{State, Summary, say},
};
use crate::tools::cmd::capture;

const TRACEFS: &str = "/sys/kernel/tracing";

/// A tracepoint the agent attaches to: proves tracefs is mounted and the kernel has it.
const PROBE_TRACEPOINT: &str = "/sys/kernel/tracing/events/sched/sched_process_exec";

pub(super) fn tracefs(opts: &Options, summary: &mut Summary) -> Result<()> {
    const STEP: &str = "tracefs";
    let events = Path::new(TRACEFS).join("events");
    match fs::metadata(&events) {
        Ok(_) => {
            say(STEP, format!("already mounted at {TRACEFS}"));
            summary.add(STEP, State::Present, TRACEFS);
        }
        Err(e) if opts.check => {
            let why = if e.kind() == ErrorKind::PermissionDenied {
                "cannot read it without root"
            } else {
                "not mounted"
            };
            say(STEP, format!("{why} ({})", events.display()));
            summary.add(STEP, State::Missing, format!("{TRACEFS}: {why}"));
            return Ok(());
        }
        Err(_) => {
            say(STEP, format!("mounting tracefs at {TRACEFS}"));
            capture(Command::new("mount").args(["-t", "tracefs", "tracefs", TRACEFS]))
                .context("mounting tracefs failed")?;
            summary.add(STEP, State::Installed, format!("mounted at {TRACEFS}"));
        }
    }
    if !Path::new(PROBE_TRACEPOINT).exists() {
        bail!(
            "tracefs is mounted at {TRACEFS} but {PROBE_TRACEPOINT} does not exist: this kernel \
             lacks the sched tracepoints the agent needs"
        );
    }
    Ok(())
}
