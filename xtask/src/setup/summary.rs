//! What setup tells: a line per step as it goes, and the summary table at the end.

use std::time::Duration;

pub(super) fn say(step: &str, message: impl AsRef<str>) {
    eprintln!("setup: {step} ... {}", message.as_ref());
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Present,
    Installed,
    Missing,
}

#[derive(Debug, Default)]
pub(super) struct Summary {
    rows: Vec<(&'static str, State, String)>,
}

impl Summary {
    pub(super) fn add(&mut self, step: &'static str, state: State, detail: impl Into<String>) {
        self.rows.push((step, state, detail.into()));
    }

    pub(super) fn missing(&self) -> Vec<&'static str> {
        self.rows
            .iter()
            .filter(|(_, state, _)| *state == State::Missing)
            .map(|(step, _, _)| *step)
            .collect()
    }

    pub(super) fn print(&self, title: &str, elapsed: Duration) {
        eprintln!("{title}: summary ({:.1} s)", elapsed.as_secs_f64());
        for (step, state, detail) in &self.rows {
            let state = match state {
                State::Present => "ok",
                State::Installed => "INSTALLED",
                State::Missing => "MISSING",
            };
            eprintln!("  {step:<18} {state:<10} {detail}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_reports_missing_steps() {
        let mut summary = Summary::default();
        summary.add("a", State::Present, "");
        summary.add("b", State::Missing, "");
        summary.add("c", State::Installed, "");
        assert_eq!(summary.missing(), ["b"]);
    }
}
