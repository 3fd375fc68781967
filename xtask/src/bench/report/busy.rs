//! The busy-node sections of the report (issue 52): cost per lifecycle by backend and K,
//! containerd's throughput with and without plegd, plegd's own share of each death under
//! overload, and a cold start at density; each number beside its goal.

use std::{collections::BTreeMap, fmt::Write as _};

use serde_json::Value;

use super::{Goal, fixed, ms, percentile};

/// Runtime calls per lifecycle, default mode, at every K and with both backends.
const CALLS_GOAL: f64 = 3.0;
/// containerd's throughput beside plegd over without it (ratio of the medians).
const THROUGHPUT_GOAL: f64 = 0.95;
/// plegd's own share of a ContainerDied after containerd published `/tasks/exit`, p99, ms.
const SHARE_P99_GOAL: f64 = 10.0;
/// The pods at which the cold start goals are read.
const DENSITY_PODS: u64 = 1_000;
/// Exec to `/readyz` 200 and to a complete `ListPods`, ms.
const COLD_START_GOAL: f64 = 2_000.0;
/// RSS once everything is listed, MiB.
const DENSITY_RSS_GOAL: f64 = 32.0;

fn rows<'a>(m: &'a Value, section: &str) -> impl Iterator<Item = &'a Value> {
    m[section].as_array().into_iter().flatten()
}

/// An array of numbers.
fn array(v: &Value) -> Vec<f64> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_f64)
        .collect()
}

fn median(v: &[f64]) -> Option<f64> {
    percentile(v, 50.0)
}

fn min_max(v: &[f64]) -> (Option<f64>, Option<f64>) {
    (
        v.iter().copied().reduce(f64::min),
        v.iter().copied().reduce(f64::max),
    )
}

/// A cost row's missing events: lifecycles with none at all, and those without each owed one.
fn missing(row: &Value) -> [u64; 4] {
    let m = &row["missing"];
    ["no_event", "started", "died", "removed"].map(|k| m[k].as_u64().unwrap_or(0))
}

/// Per K and configuration with plegd, the ratio of its median to the median without plegd.
fn throughput_ratios(m: &Value) -> BTreeMap<(u64, String), f64> {
    let mut by_k: BTreeMap<u64, BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    for row in rows(m, "throughput") {
        let (Some(k), Some(config)) = (row["in_flight"].as_u64(), row["config"].as_str()) else {
            continue;
        };
        by_k.entry(k)
            .or_default()
            .insert(config.to_owned(), array(&row["per_second"]));
    }
    let mut ratios = BTreeMap::new();
    for (k, configs) in by_k {
        let Some(none) = configs.get("none") else {
            continue;
        };
        for (config, with) in configs.iter().filter(|(c, _)| *c != "none") {
            if let (Some(a), Some(b)) = (median(with), median(none))
                && b > 0.0
            {
                ratios.insert((k, config.clone()), a / b);
            }
        }
    }
    ratios
}

/// Whether a mode of the overload section has an event source (polling is the reference).
fn event_mode(row: &Value) -> bool {
    row["mode"]
        .as_str()
        .is_some_and(|m| !m.starts_with("polling"))
}

/// The busy node's goals: the cost runs', the throughput beside plegd, the overload share and
/// the cold start at density.
pub(super) fn goals(m: &Value) -> Vec<Goal> {
    let [calls, lost] = cost_goals(m);
    vec![
        calls,
        lost,
        throughput_goal(m),
        overload_goal(m),
        cold_start_goal(m),
    ]
}

/// Runtime calls per lifecycle at each K and backend, and the lifecycles the watcher missed
/// events of.
fn cost_goals(m: &Value) -> [Goal; 2] {
    let cost: Vec<&Value> = rows(m, "cost").collect();
    let calls: Vec<String> = cost
        .iter()
        .map(|r| {
            format!(
                "{} K={}: {}",
                r["runtime"].as_str().unwrap_or("?"),
                r["in_flight"],
                fixed(r["calls_per_lifecycle"].as_f64(), 2)
            )
        })
        .collect();
    let calls_goal = Goal {
        text: "default: ≤ 3 runtime calls per lifecycle at K = 2, 16, 64, both backends",
        measured: if calls.is_empty() {
            "n/a".into()
        } else {
            calls.join("; ")
        },
        met: (!cost.is_empty()).then(|| {
            cost.iter().all(|r| {
                r["calls_per_lifecycle"]
                    .as_f64()
                    .is_some_and(|c| c <= CALLS_GOAL)
            })
        }),
    };
    let lost: Vec<String> = cost
        .iter()
        .map(|r| {
            let [none, started, died, removed] = missing(r);
            format!(
                "{} K={}: {none} / {started} / {died} / {removed}",
                r["runtime"].as_str().unwrap_or("?"),
                r["in_flight"],
            )
        })
        .collect();
    let lost_goal = Goal {
        text: "default: every lifecycle of the cost runs seen (no event at all / no Started / no Died / no Removed: 0)",
        measured: if lost.is_empty() {
            "n/a".into()
        } else {
            lost.join("; ")
        },
        met: (!cost.is_empty()).then(|| cost.iter().all(|r| missing(r) == [0; 4])),
    };
    [calls_goal, lost_goal]
}

/// containerd's churn throughput beside plegd against without it.
fn throughput_goal(m: &Value) -> Goal {
    let ratios = throughput_ratios(m);
    Goal {
        text: "containerd's churn throughput beside plegd (default) ≥ 0.95x of without, K = 16 and 64 (ratio of the medians)",
        measured: if ratios.is_empty() {
            "n/a".into()
        } else {
            ratios
                .iter()
                .map(|((k, config), ratio)| format!("{config} K={k}: {ratio:.2}x"))
                .collect::<Vec<_>>()
                .join("; ")
        },
        met: (!ratios.is_empty()).then(|| ratios.values().all(|r| *r >= THROUGHPUT_GOAL)),
    }
}

/// plegd's own share of a death's time when the node is overloaded, in every event mode.
fn overload_goal(m: &Value) -> Goal {
    let shares: Vec<(String, Option<f64>, u64)> = rows(m, "overload")
        .filter(|r| event_mode(r))
        .map(|r| {
            (
                r["mode"].as_str().unwrap_or("?").to_owned(),
                percentile(&array(&r["share_ms"]), 99.0),
                r["no_died"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    Goal {
        text: "under overload (K = 16): plegd's own share of ContainerDied after containerd publishes /tasks/exit, p99 ≤ 10 ms in every event mode",
        measured: if shares.is_empty() {
            "n/a".into()
        } else {
            shares
                .iter()
                .map(|(mode, p99, no_died)| {
                    format!(
                        "{mode} p99 {} ms{}",
                        ms(*p99),
                        if *no_died > 0 {
                            format!(" ({no_died} without ContainerDied)")
                        } else {
                            String::new()
                        }
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        },
        met: (!shares.is_empty()).then(|| {
            shares
                .iter()
                .all(|(_, p99, no_died)| *no_died == 0 && p99.is_some_and(|v| v <= SHARE_P99_GOAL))
        }),
    }
}

/// /readyz, a complete listing and RSS at 1,000 pods.
fn cold_start_goal(m: &Value) -> Goal {
    let dense = rows(m, "density").find(|r| r["pods"].as_u64() == Some(DENSITY_PODS));
    let largest = rows(m, "density").max_by_key(|r| r["pods"].as_u64().unwrap_or(0));
    let shown = dense.or(largest);
    let mib = |r: &Value| r["rss_bytes"].as_f64().map(|b| b / f64::from(1 << 20));
    Goal {
        text: "cold start at 1,000 pods (2,000 containers): /readyz 200 and every container listed within 2 s of exec, RSS ≤ 32 MiB",
        measured: shown.map_or_else(
            || "n/a".into(),
            |r| {
                format!(
                    "{} ms to /readyz, {} ms to a complete ListPods, {} MiB at {} pods",
                    ms(r["ready_ms"].as_f64()),
                    ms(r["listed_ms"].as_f64()),
                    fixed(mib(r), 1),
                    r["pods"]
                )
            },
        ),
        met: dense.map(|r| {
            let within = |f: &str| r[f].as_f64().is_some_and(|v| v <= COLD_START_GOAL);
            within("ready_ms")
                && within("listed_ms")
                && mib(r).is_some_and(|v| v <= DENSITY_RSS_GOAL)
        }),
    }
}

/// Per backend and K: runtime calls per lifecycle by method and in all, relists, CPU, and the
/// lifecycles the watcher missed events of.
pub(super) fn cost_table(m: &Value) -> String {
    let mut t = String::from(
        "| backend | K | lifecycles | /s | calls by method per lifecycle | calls / lifecycle (goal ≤ 3) | targeted relists | full relists | answered by records | CPU ms | no event / no Started / no Died / no Removed |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows(m, "cost") {
        let by_method: Vec<String> = row["calls_per_lifecycle_by_method"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(method, v)| Some((method, v.as_f64()?)))
            .filter(|(_, v)| *v > 0.0)
            .map(|(method, v)| format!("{method} {v:.2}"))
            .collect();
        let [none, started, died, removed] = missing(row);
        let failed = row["failed"].as_u64().unwrap_or(0);
        let _ = writeln!(
            t,
            "| {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {none} / {started} / {died} / {removed} |",
            row["runtime"].as_str().unwrap_or("?"),
            row["in_flight"],
            row["lifecycles"],
            if failed > 0 {
                format!(" ({failed} failed)")
            } else {
                String::new()
            },
            fixed(row["per_second"].as_f64(), 1),
            by_method.join(", "),
            fixed(row["calls_per_lifecycle"].as_f64(), 2),
            fixed(row["targeted_relists_per_lifecycle"].as_f64(), 2),
            fixed(row["full_relists_per_lifecycle"].as_f64(), 2),
            fixed(row["answered_by_records_per_lifecycle"].as_f64(), 2),
            fixed(row["cpu_ms_per_lifecycle"].as_f64(), 2),
        );
    }
    t
}

/// Per K and configuration: lifecycles per second over the rounds, the ratio of the medians to
/// no plegd's, and the CPU time per lifecycle of containerd and plegd (medians of the rounds).
pub(super) fn throughput_table(m: &Value) -> String {
    let mut t = String::from(
        "| K | configuration | rounds | median /s | min | max | median / no plegd's (goal ≥ 0.95) | containerd CPU ms / lifecycle | plegd CPU ms / lifecycle |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let ratios = throughput_ratios(m);
    for row in rows(m, "throughput") {
        let rates = array(&row["per_second"]);
        let (min, max) = min_max(&rates);
        let config = row["config"].as_str().unwrap_or("?");
        let k = row["in_flight"].as_u64().unwrap_or(0);
        let ratio = ratios
            .get(&(k, config.to_owned()))
            .map_or_else(String::new, |r| format!("{r:.2}x"));
        let _ = writeln!(
            t,
            "| {k} | {} | {} | {} | {} | {} | {ratio} | {} | {} |",
            if config == "none" {
                "no plegd".to_owned()
            } else {
                format!(
                    "plegd default, --runtime {}",
                    config.trim_start_matches("plegd-")
                )
            },
            rates.len(),
            fixed(median(&rates), 2),
            fixed(min, 2),
            fixed(max, 2),
            fixed(median(&array(&row["containerd_cpu_ms_per_lifecycle"])), 2),
            fixed(median(&array(&row["plegd_cpu_ms_per_lifecycle"])), 2),
        );
    }
    t
}

/// Per mode: plegd's own share of each ContainerDied after containerd published `/tasks/exit`.
pub(super) fn overload_table(m: &Value) -> String {
    let mut t = String::from(
        "| mode | K | lifecycles | /s | deaths timed | share p50 | p99 (goal ≤ 10) | max | another subscriber p50 / p99 | plegd after it p50 / p99 | no ContainerDied |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows(m, "overload") {
        let share = array(&row["share_ms"]);
        let arrival = array(&row["arrival_ms"]);
        let beyond = array(&row["beyond_arrival_ms"]);
        let _ = writeln!(
            t,
            "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} |",
            row["label"].as_str().unwrap_or("?"),
            if event_mode(row) { "" } else { " (reference)" },
            row["in_flight"],
            row["lifecycles"],
            fixed(row["per_second"].as_f64(), 1),
            share.len(),
            ms(percentile(&share, 50.0)),
            ms(percentile(&share, 99.0)),
            ms(percentile(&share, 100.0)),
            ms(percentile(&arrival, 50.0)),
            ms(percentile(&arrival, 99.0)),
            ms(percentile(&beyond, 50.0)),
            ms(percentile(&beyond, 99.0)),
            row["no_died"],
        );
    }
    t
}

/// Per node size: exec to `/readyz` 200 and to a complete `ListPods`, and RSS then.
pub(super) fn density_table(m: &Value) -> String {
    let mut t = String::from(
        "| pods | containers (exited) | exec → /readyz 200 ms | exec → every container listed ms | RSS MiB | peak RSS MiB | made in s |\n|---|---|---|---|---|---|---|\n",
    );
    let mib = |v: &Value| fixed(v.as_f64().map(|b| b / f64::from(1 << 20)), 1);
    for row in rows(m, "density") {
        let unlisted = row["unlisted"].as_u64().unwrap_or(0);
        let _ = writeln!(
            t,
            "| {} | {} ({}) | {} | {}{} | {} | {} | {} |",
            row["pods"],
            row["containers"],
            row["exited"],
            ms(row["ready_ms"].as_f64()),
            ms(row["listed_ms"].as_f64()),
            if unlisted > 0 {
                format!(" ({unlisted} never listed right)")
            } else {
                String::new()
            },
            mib(&row["rss_bytes"]),
            mib(&row["peak_rss_bytes"]),
            fixed(row["fill_s"].as_f64(), 1),
        );
    }
    t
}

/// The busy-node part of the report: the tables of the sections that ran, with what each
/// measures. Empty when none ran.
pub(super) fn sections(m: &Value) -> String {
    let mut r = String::new();
    if m["cost"].is_array() {
        let _ = write!(
            r,
            "## 6. Cost per lifecycle on a busy node\n\n{} lifecycles per run through CRI in one \
             pod (create `sleep 1000`, start, ContainerStatus every 20 ms until RUNNING, kill -9 \
             of its init, until EXITED, remove), K in flight; plegd in default mode with each \
             backend. Per lifecycle: the rise of `plegd_runtime_calls_total` by method, of \
             `plegd_relists_total` (targeted, full) and `plegd_answered_by_records_total`, and \
             plegd's CPU, from 2 s before the first create to 2 s after the last removal. The \
             last column counts the lifecycles a `plegd watch` got no event of at all, and \
             those without each owed event (10 s allowed for stragglers).\n\n{}\n",
            m["cost_lifecycles"],
            cost_table(m)
        );
    }
    if m["throughput"].is_array() {
        let _ = write!(
            r,
            "## 7. containerd's throughput beside plegd\n\nThe same lifecycles per second \
             (completed over the run's wall time), rounds alternated: no plegd, plegd with each \
             backend, again. The goal is read on the ratio of the medians.\n\n{}\n",
            throughput_table(m)
        );
    }
    if m["overload"].is_array() {
        let _ = write!(
            r,
            "## 8. plegd's own share of a death under overload (ms)\n\nThe same lifecycles, K \
             in flight, per mode: each ContainerDied's `emitted_at` minus the publish time of \
             containerd's `/tasks/exit` envelope for that container (the envelope's \
             timestamp, read by the bench's own Events subscription). Polling 1 s is there for \
             reference: a lifecycle shorter than its period may give no ContainerDied.\n\n{}\n",
            overload_table(m)
        );
    }
    if m["density"].is_array() {
        let _ = write!(
            r,
            "## 9. Cold start at density\n\nPods made on the runtime before plegd starts (each \
             a sandbox and one container; every 10th container exited with a code of its own), \
             then plegd exec'd in default mode: the time until `/readyz` answers 200, until a \
             `ListPods` shows every sandbox and container in its state with its exit code, and \
             plegd's RSS then.\n\n{}\n",
            density_table(m)
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn goal<'a>(goals: &'a [Goal], start: &str) -> &'a Goal {
        goals
            .iter()
            .find(|g| g.text.starts_with(start))
            .unwrap_or_else(|| panic!("no goal {start:?}"))
    }

    #[test]
    fn calls_and_losses_are_read_per_backend_and_k() {
        let m = json!({"cost": [
            {"runtime": "cri", "in_flight": 2, "lifecycles": 64, "failed": 0, "per_second": 3.0,
             "calls_per_lifecycle": 2.5,
             "calls_per_lifecycle_by_method": {"ListContainers": 0.5, "ContainerStatus": 2.0, "Version": 0.0},
             "missing": {"no_event": 0, "started": 0, "died": 0, "removed": 0}},
            {"runtime": "containerd", "in_flight": 16, "lifecycles": 64, "failed": 1,
             "calls_per_lifecycle": 3.5, "calls_per_lifecycle_by_method": {},
             "missing": {"no_event": 30, "started": 30, "died": 31, "removed": 30}},
        ]});
        let goals = goals(&m);
        let calls = goal(&goals, "default: ≤ 3 runtime calls");
        assert_eq!(calls.measured, "cri K=2: 2.50; containerd K=16: 3.50");
        assert_eq!(calls.met, Some(false));
        let seen = goal(&goals, "default: every lifecycle");
        assert_eq!(
            seen.measured,
            "cri K=2: 0 / 0 / 0 / 0; containerd K=16: 30 / 30 / 31 / 30"
        );
        assert_eq!(seen.met, Some(false));
        let table = cost_table(&m);
        assert!(
            table.contains(
                "| cri | 2 | 64 | 3.0 | ContainerStatus 2.00, ListContainers 0.50 | 2.50 |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| containerd | 16 | 64 (1 failed) |"),
            "{table}"
        );
        assert!(table.ends_with("| 30 / 30 / 31 / 30 |\n"), "{table}");
    }

    #[test]
    fn throughput_compares_medians_and_shows_the_spread() {
        let m = json!({"throughput": [
            {"in_flight": 16, "config": "none", "per_second": [10.0, 8.0, 9.0, 11.0, 7.0],
             "containerd_cpu_ms_per_lifecycle": [20.0, 22.0, 21.0, 19.0, 25.0]},
            {"in_flight": 16, "config": "plegd-cri", "per_second": [9.0, 8.0, 8.5, 12.0, 6.0],
             "containerd_cpu_ms_per_lifecycle": [21.0, 23.0, 22.0, 20.0, 26.0],
             "plegd_cpu_ms_per_lifecycle": [1.5, 1.25, 2.0, 1.0, 1.75]},
        ]});
        let goals = goals(&m);
        let g = goal(&goals, "containerd's churn throughput");
        assert_eq!(
            (g.measured.as_str(), g.met),
            ("plegd-cri K=16: 0.94x", Some(false))
        );
        let table = throughput_table(&m);
        assert!(
            table.contains("| 16 | no plegd | 5 | 9.00 | 7.00 | 11.00 |  | 21.00 | n/a |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| 16 | plegd default, --runtime cri | 5 | 8.50 | 6.00 | 12.00 | 0.94x | 22.00 | 1.50 |"
            ),
            "{table}"
        );
    }

    #[test]
    fn the_share_goal_reads_event_modes_only_and_fails_on_a_missing_death() {
        let shares: Vec<f64> = (1..=100).map(f64::from).map(|v| v / 10.0).collect();
        let m = json!({"overload": [
            {"mode": "default", "label": "default", "in_flight": 16, "lifecycles": 100,
             "share_ms": shares, "arrival_ms": [4.0, 8.0], "beyond_arrival_ms": [-1.0, 1.0],
             "no_died": 0},
            {"mode": "polling-1s", "label": "polling 1 s", "share_ms": [900.0], "no_died": 50},
        ]});
        let goals = goals(&m);
        let g = goal(&goals, "under overload");
        assert_eq!(
            (g.measured.as_str(), g.met),
            ("default p99 9.9 ms", Some(true))
        );
        let table = overload_table(&m);
        assert!(
            table.contains(
                "| default | 16 | 100 | n/a | 100 | 5.0 | 9.9 | 10.0 | 4.0 / 8.0 | -1.0 / 1.0 | 0 |"
            ),
            "{table}"
        );
        assert!(table.contains("| polling 1 s (reference) |"), "{table}");
        let mut m = m;
        m["overload"][0]["no_died"] = json!(1);
        assert_eq!(goal(&super::goals(&m), "under overload").met, Some(false));
    }

    #[test]
    fn the_cold_start_goal_is_read_at_1000_pods_only() {
        let row = |pods: u64, ready: f64, rss: u64| {
            json!({"pods": pods, "containers": pods * 2, "exited": pods / 10, "ready_ms": ready,
                   "listed_ms": ready + 100.0, "unlisted": 0, "rss_bytes": rss << 20,
                   "peak_rss_bytes": (rss + 4) << 20, "fill_s": 12.0})
        };
        let m = json!({"density": [row(250, 400.0, 20)]});
        let g = goal(&goals(&m), "cold start").met;
        assert_eq!(g, None);
        let m = json!({"density": [row(250, 400.0, 20), row(1000, 1800.0, 30)]});
        let goals = goals(&m);
        let g = goal(&goals, "cold start");
        assert_eq!(
            (g.measured.as_str(), g.met),
            (
                "1800 ms to /readyz, 1900 ms to a complete ListPods, 30.0 MiB at 1000 pods",
                Some(true)
            )
        );
        let table = density_table(&m);
        assert!(
            table.contains("| 1000 | 2000 (100) | 1800 | 1900 | 30.0 | 34.0 | 12.0 |"),
            "{table}"
        );
    }
}
