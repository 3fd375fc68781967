//! The steps of a long task with when each began and how long it took, told as each ends and
//! again as a table at the end (also after a failure), so a slow or failed run says where its
//! time went. Steps may run side by side (from several threads): the table's total is the
//! task's own time, not the sum of its steps'.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::workspace::format_duration;

#[derive(Debug)]
pub struct Steps {
    /// Starts each line: the task's name (`fresh`, `xtask test`).
    task: &'static str,
    start: Instant,
    rows: Mutex<Vec<Row>>,
}

#[derive(Debug, Clone)]
struct Row {
    name: String,
    /// From the task's start to the step's.
    began: Duration,
    took: Duration,
    ok: bool,
}

impl Steps {
    pub fn new(task: &'static str) -> Self {
        Self {
            task,
            start: Instant::now(),
            rows: Mutex::new(Vec::new()),
        }
    }

    /// Runs `step`, saying when it starts and how it ended.
    pub fn time<T>(&self, name: &str, step: impl FnOnce() -> Result<T>) -> Result<T> {
        eprintln!("{}: {name}", self.task);
        let start = Instant::now();
        let result = step();
        let took = start.elapsed();
        eprintln!(
            "{}: {name}: {} after {}",
            self.task,
            if result.is_ok() { "done" } else { "FAILED" },
            format_duration(took)
        );
        self.rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Row {
                name: name.to_owned(),
                began: start.duration_since(self.start),
                took,
                ok: result.is_ok(),
            });
        result
    }

    pub fn print(&self) {
        eprint!("{}", self.table(self.start.elapsed()));
    }

    /// The steps in the order they began, and `total`.
    fn table(&self, total: Duration) -> String {
        let mut rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        rows.sort_by_key(|row| row.began);
        let width = rows
            .iter()
            .map(|row| row.name.len())
            .chain([5])
            .max()
            .unwrap_or_default();
        let mut table = format!(
            "{}: steps\n  {:<width$} {:<7} {:>6} {:>6}\n",
            self.task, "", "", "began", "took"
        );
        for row in &rows {
            let state = if row.ok { "ok" } else { "FAILED" };
            table += &format!(
                "  {:<width$} {state:<7} {:>6} {:>6}\n",
                row.name,
                format_duration(row.began),
                format_duration(row.took)
            );
        }
        table += &format!(
            "  {:<width$} {:<7} {:>6} {:>6}\n",
            "total",
            "",
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
    fn the_table_lists_each_step_in_the_order_they_began_and_the_tasks_own_time() {
        let steps = Steps::new("task");
        std::thread::scope(|s| {
            s.spawn(|| steps.time("beside", || Ok(())).unwrap());
        });
        steps.time("first", || Ok(())).unwrap();
        let failed: Result<()> = steps.time("second step", || bail!("no"));
        assert!(failed.is_err());
        let table = steps.table(Duration::from_secs(75));
        let lines: Vec<_> = table.lines().collect();
        assert_eq!(lines[0], "task: steps");
        assert_eq!(lines[1], format!("  {:11} {:7}  began   took", "", ""));
        assert!(
            lines[2].starts_with("  beside      ok        0.0s   0.0s"),
            "{table}"
        );
        assert!(
            lines[3].starts_with("  first       ok        0.0s   0.0s"),
            "{table}"
        );
        assert!(
            lines[4].starts_with("  second step FAILED    0.0s   0.0s"),
            "{table}"
        );
        assert_eq!(
            lines[5],
            format!("  {:<11} {:7} {:6}  1m15s", "total", "", "")
        );
        assert_eq!(lines.len(), 6, "{table}");
    }
}
