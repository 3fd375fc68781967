//! The steps of a long task with how long each took, told as each ends and again as a table
//! at the end (also after a failure), so a slow or failed run says where its time went.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::workspace::format_duration;

#[derive(Debug)]
pub struct Steps {
    /// Starts each line: the task's name (`fresh`, `xtask test`).
    task: &'static str,
    rows: Vec<(String, Duration, bool)>,
}

impl Steps {
    pub fn new(task: &'static str) -> Self {
        Self {
            task,
            rows: Vec::new(),
        }
    }

    /// Runs `step`, saying when it starts and how it ended.
    pub fn time<T>(&mut self, name: &str, step: impl FnOnce() -> Result<T>) -> Result<T> {
        eprintln!("{}: {name}", self.task);
        let start = Instant::now();
        let result = step();
        let elapsed = start.elapsed();
        eprintln!(
            "{}: {name}: {} after {}",
            self.task,
            if result.is_ok() { "done" } else { "FAILED" },
            format_duration(elapsed)
        );
        self.rows.push((name.to_owned(), elapsed, result.is_ok()));
        result
    }

    pub fn print(&self) {
        eprint!("{}", self.table());
    }

    fn table(&self) -> String {
        let width = self
            .rows
            .iter()
            .map(|(name, ..)| name.len())
            .chain([5])
            .max()
            .unwrap_or_default();
        let mut table = format!("{}: steps\n", self.task);
        for (name, elapsed, ok) in &self.rows {
            let state = if *ok { "ok" } else { "FAILED" };
            table += &format!(
                "  {name:<width$} {state:<7} {}\n",
                format_duration(*elapsed)
            );
        }
        let total: Duration = self.rows.iter().map(|(_, d, _)| *d).sum();
        table += &format!(
            "  {:<width$} {:<7} {}\n",
            "total",
            "",
            format_duration(total)
        );
        table
    }
}

#[cfg(test)]
mod tests {
    use anyhow::bail;

    use super::*;

    #[test]
    fn the_table_lists_each_step_its_state_and_the_total() {
        let mut steps = Steps::new("task");
        steps.time("first", || Ok(())).unwrap();
        let failed: Result<()> = steps.time("second step", || bail!("no"));
        assert!(failed.is_err());
        let table = steps.table();
        let lines: Vec<_> = table.lines().collect();
        assert_eq!(lines[0], "task: steps");
        assert!(lines[1].starts_with("  first       ok      "), "{table}");
        assert!(lines[2].starts_with("  second step FAILED  "), "{table}");
        assert!(lines[3].starts_with("  total               "), "{table}");
        assert_eq!(lines.len(), 4, "{table}");
    }
}
