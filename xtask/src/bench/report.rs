//! The report: `results.json` of the `node` bench and criterion's estimates turned into
//! Markdown, with the goals each number is read against (met / not met: reported, never
//! asserted), and the summary that goes into docs/benchmarks.md between its markers.

mod busy;

use std::{fmt::Write as _, path::Path};

use anyhow::{Result, bail};
use serde_json::Value;

pub const SUMMARY_START: &str = "<!-- bench:summary:start -->";
pub const SUMMARY_END: &str = "<!-- bench:summary:end -->";
/// The page whose summary table `cargo xtask bench` rewrites, relative to the workspace root.
pub const SUMMARY_PAGE: &str = "docs/benchmarks.md";

/// The criterion pod counts of the `relist` bench's `relist_core` group.
const CORE_PODS: [u64; 3] = [100, 1_000, 10_000];

pub struct Run<'a> {
    pub measured: &'a Value,
    pub criterion: &'a Path,
    pub revision: &'a str,
    pub command_line: &'a str,
    pub quick: bool,
    pub date: &'a str,
}

/// The `q`-th percentile (nearest rank) of `values`; `None` when empty.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// The numbers of `field` in each object of `rows`.
pub fn numbers(rows: &Value, field: &str) -> Vec<f64> {
    rows.as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| row[field].as_f64())
        .collect()
}

/// Per row, `a - b` where both were measured.
fn differences(rows: &Value, a: &str, b: &str) -> Vec<f64> {
    rows.as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| Some(row[a].as_f64()? - row[b].as_f64()?))
        .collect()
}

/// `value` with `places` decimals, or "n/a" where it was not measured.
fn fixed(value: Option<f64>, places: usize) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.places$}"))
}

fn ms(value: Option<f64>) -> String {
    match value {
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
        None => "n/a".into(),
    }
}

/// A time relative to another, with its sign: `+1.3`, `-0.4`, never `-0.0`.
fn signed_ms(value: Option<f64>) -> String {
    match value {
        Some(v) if v.abs() >= 100.0 => format!("{v:+.0}"),
        // A small negative value rounds to zero, which has no sign.
        Some(v) => match format!("{v:+.1}") {
            zero if zero == "-0.0" => "+0.0".into(),
            signed => signed,
        },
        None => "n/a".into(),
    }
}

fn mode<'a>(measured: &'a Value, key: &str) -> Option<&'a Value> {
    measured["latency"]
        .as_array()?
        .iter()
        .find(|m| m["mode"] == key && m["unavailable"].is_null())
}

/// The default mode's churn row at the lowest rate asked for (the rate a node sustains).
fn default_churn(measured: &Value) -> Option<&Value> {
    measured["churn"]
        .as_array()?
        .iter()
        .filter(|row| row["mode"] == "default")
        .min_by(|a, b| {
            a["rate"]
                .as_f64()
                .unwrap_or(0.0)
                .total_cmp(&b["rate"].as_f64().unwrap_or(0.0))
        })
}

fn p50_died(measured: &Value, key: &str) -> Option<f64> {
    percentile(&numbers(&mode(measured, key)?["kills"], "died_ms"), 50.0)
}

/// Per-pod time (ns) of a criterion benchmark `relist_core/<kind>/<pods>`.
fn core_ns_per_pod(criterion: &Path, kind: &str, pods: u64) -> Option<f64> {
    let path = criterion.join(format!("relist_core/{kind}/{pods}/new/estimates.json"));
    let estimates: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    Some(estimates["median"]["point_estimate"].as_f64()? / pods as f64)
}

/// An idle row of `mode` at `containers`.
fn idle_row<'a>(measured: &'a Value, mode: &str, containers: u64) -> Option<&'a Value> {
    measured["idle"]
        .as_array()?
        .iter()
        .find(|r| r["mode"] == mode && r["containers"].as_u64() == Some(containers))
}

/// CPU plegd adds to the node: its own and what it makes containerd spend, % of a core.
fn added_cpu(row: &Value) -> Option<f64> {
    Some(row["plegd_cpu"].as_f64()? + row["containerd_added_cpu"].as_f64()?)
}

fn largest_idle(measured: &Value) -> Option<u64> {
    measured["idle"]
        .as_array()?
        .iter()
        .filter_map(|r| r["containers"].as_u64())
        .max()
}

struct Goal {
    text: &'static str,
    measured: String,
    met: Option<bool>,
}

/// Every goal, in the report's order: the relist's, then the busy node's.
fn goals(run: &Run) -> Vec<Goal> {
    let m = run.measured;
    let mut goals = exit_goals(m);
    goals.extend([churn_goal(m), polling_goal(m), kernel_observation_goal(m)]);
    goals.extend(idle_goals(m));
    goals.extend([relist_scale_goal(run.criterion), in_kernel_goal(m)]);
    goals.extend(busy::goals(m));
    goals
}

/// Both met when both were measured.
fn both(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    Some(a? && b?)
}

/// How long after containerd's own exit record (its `exited_at`) a death reaches the watcher,
/// for kill -9s and OOM kills, and what plegd itself adds once that record reached it.
fn exit_goals(m: &Value) -> Vec<Goal> {
    let default_kills = mode(m, "default").map(|d| &d["kills"]);
    let default_ooms = mode(m, "default").map(|d| &d["ooms"]);
    // Over containerd's own exit record (its `exited_at`), p50 and p99.
    let over_exit = |rows: Option<&Value>, at: &str| {
        let over = rows.map_or_else(Vec::new, |r| differences(r, at, "exit_ms"));
        (percentile(&over, 50.0), percentile(&over, 99.0))
    };
    let (over50, over99) = over_exit(default_kills, "died_ms");
    let (oom50, oom99) = over_exit(default_ooms, "died_ms");
    // The same, at plegd's emission: what is left is the way to the client.
    let (emitted50, emitted99) = over_exit(default_kills, "emitted_ms");
    let (oom_emitted50, oom_emitted99) = over_exit(default_ooms, "emitted_ms");
    // What plegd adds once `/tasks/exit` reached a subscriber: to its own emission.
    let added50 = {
        let mut added = Vec::new();
        for rows in [default_kills, default_ooms].into_iter().flatten() {
            added.extend(differences(rows, "emitted_ms", "exit_arrival_ms"));
        }
        percentile(&added, 50.0)
    };
    vec![
        Goal {
            text: "default: kill -9 → ContainerDied p50 within 2 ms of containerd's /tasks/exit, p99 within 10 ms",
            measured: format!(
                "p50 {} ms, p99 {} ms (emitted by plegd: p50 {}, p99 {})",
                signed_ms(over50),
                signed_ms(over99),
                signed_ms(emitted50),
                signed_ms(emitted99)
            ),
            met: both(over50.map(|v| v <= 2.0), over99.map(|v| v <= 10.0)),
        },
        Goal {
            text: "default: OOM kill → ContainerDied p50 within 2 ms of containerd's /tasks/exit, p99 within 10 ms",
            measured: format!(
                "p50 {} ms, p99 {} ms (emitted by plegd: p50 {}, p99 {})",
                signed_ms(oom50),
                signed_ms(oom99),
                signed_ms(oom_emitted50),
                signed_ms(oom_emitted99)
            ),
            met: both(oom50.map(|v| v <= 2.0), oom99.map(|v| v <= 10.0)),
        },
        Goal {
            text: "default: what plegd adds after /tasks/exit reaches a subscriber, p50 ≤ 0.5 ms",
            measured: format!(
                "p50 {} ms (kill -9s and OOM kills; negative: plegd emitted first)",
                fixed(added50, 2)
            ),
            met: added50.map(|v| v <= 0.5),
        },
    ]
}

/// plegd's CPU and relists per lifecycle under the default mode's slowest churn.
fn churn_goal(m: &Value) -> Goal {
    let churn = default_churn(m);
    let churn_cost = |field| churn.and_then(|row| row[field].as_f64());
    let (churn_cpu, churn_relists) = (
        churn_cost("cpu_ms_per_lifecycle"),
        churn_cost("relists_per_lifecycle"),
    );
    Goal {
        text: "default under churn (its lowest rate): ≤ 2 ms of plegd CPU and ≤ 3 relists per lifecycle",
        measured: format!(
            "{} ms, {} relists per lifecycle at {}/s",
            fixed(churn_cpu, 2),
            fixed(churn_relists, 2),
            churn.map_or("n/a".into(), |row| row["rate"].to_string()),
        ),
        met: both(churn_cpu.map(|v| v <= 2.0), churn_relists.map(|v| v <= 3.0)),
    }
}

/// The default mode's p50 against both pollings'.
fn polling_goal(m: &Value) -> Goal {
    let default50 = p50_died(m, "default");
    let ratio = |key| Some(p50_died(m, key)? / default50?);
    let (r1, r100) = (ratio("polling-1s"), ratio("polling-100ms"));
    Goal {
        text: "default p50 ≥ 50x faster than polling 1 s, ≥ 5x faster than polling 100 ms",
        measured: format!("{}x, {}x", fixed(r1, 1), fixed(r100, 1)),
        met: both(r1.map(|r| r >= 50.0), r100.map(|r| r >= 5.0)),
    }
}

/// The kernel's word of a death at the watcher, ahead of the runtime's.
fn kernel_observation_goal(m: &Value) -> Goal {
    let default_kills = mode(m, "default").map(|d| &d["kills"]);
    let kernel50 = default_kills.and_then(|k| percentile(&numbers(k, "kernel_ms"), 50.0));
    Goal {
        text: "default: the kernel's observation of a death at a watcher p50 ≤ 0.5 ms",
        measured: format!("p50 {} ms after the kill", fixed(kernel50, 2)),
        met: kernel50.map(|v| v <= 0.5),
    }
}

/// What an idle node pays at the largest idle size: CPU against polling 1 s's, and RSS.
fn idle_goals(m: &Value) -> Vec<Goal> {
    let biggest = largest_idle(m);
    let idle = |key| idle_row(m, key, biggest?).and_then(added_cpu);
    let (idle_default, idle_polling) = (idle("default"), idle("polling-1s"));
    let rss = biggest
        .and_then(|n| idle_row(m, "default", n))
        .and_then(|r| r["rss_bytes"].as_f64())
        .map(|b| b / (1 << 20) as f64);
    vec![
        Goal {
            text: "idle CPU added (plegd + containerd's extra) ≤ 1/10 of polling 1 s's",
            measured: format!(
                "{} % vs {} % of a core at {} containers",
                fixed(idle_default, 2),
                fixed(idle_polling, 2),
                biggest.unwrap_or(0)
            ),
            met: idle_default
                .zip(idle_polling)
                // Both below the window's tick resolution: nothing to compare.
                .filter(|&(d, p)| d > 0.0 || p > 0.0)
                .map(|(d, p)| d <= p / 10.0),
        },
        Goal {
            text: "default: RSS < 50 MiB at 300 containers",
            measured: format!(
                "{} MiB at {} containers",
                fixed(rss, 1),
                biggest.unwrap_or(0)
            ),
            met: if biggest == Some(300) {
                rss.map(|v| v < 50.0)
            } else {
                None
            },
        },
    ]
}

/// The pure core's per-pod relist time from 100 to 10,000 pods (criterion's estimates).
fn relist_scale_goal(criterion: &Path) -> Goal {
    let flat = |kind| {
        Some(core_ns_per_pod(criterion, kind, 10_000)? / core_ns_per_pod(criterion, kind, 100)?)
    };
    let (flat_steady, flat_changed) = (flat("steady"), flat("changed"));
    let flat_dropped = flat("dropped");
    Goal {
        text: "per-pod relist cost flat from 100 to 10,000 pods (within 1.5x)",
        measured: format!(
            "10,000 / 100 pods per-pod time: steady {}x, every pod changed {}x (the \
             runtime's listing only dropped: {}x)",
            fixed(flat_steady, 2),
            fixed(flat_changed, 2),
            fixed(flat_dropped, 2)
        ),
        met: both(
            flat_steady.map(|v| v <= 1.5),
            flat_changed.map(|v| v <= 1.5),
        ),
    }
}

/// The eBPF programs on the exec and exit tracepoints, time per run in the kernel.
fn in_kernel_goal(m: &Value) -> Goal {
    let kernel: Vec<(String, f64)> = m["kernel"]["programs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["program"].as_str().is_some_and(|n| {
                n.contains("sched_process_exec") || n.contains("sched_process_exit")
            })
        })
        .filter_map(|p| Some((p["program"].as_str()?.to_owned(), p["ns_per_run"].as_f64()?)))
        .collect();
    Goal {
        text: "< 1 µs in-kernel per run on sched_process_exec/exit",
        measured: if kernel.is_empty() {
            "n/a".into()
        } else {
            kernel
                .iter()
                .map(|(n, ns)| format!("{n} {ns:.0} ns"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        met: (!kernel.is_empty()).then(|| kernel.iter().all(|(_, ns)| *ns < 1_000.0)),
    }
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "not met",
        None => "not measured",
    }
}

/// Per mode: ContainerDied p50/p90/p99/max, distance to both anchors, ratios to the pollings.
fn latency_table(m: &Value) -> String {
    let mut t = String::from(
        "| mode | kills | p50 | p90 | p99 | max | − /tasks/exit p50 / p99 | − CRI EXITED p50 / p99 | p50 vs polling 1 s | p50 vs polling 100 ms |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let p1 = p50_died(m, "polling-1s");
    let p100 = p50_died(m, "polling-100ms");
    for row in m["latency"].as_array().into_iter().flatten() {
        let label = row["label"].as_str().unwrap_or("?");
        if let Some(why) = row["unavailable"].as_str() {
            let _ = writeln!(t, "| {label} | n/a: {why} | | | | | | | | |");
            continue;
        }
        let kills = &row["kills"];
        let died = numbers(kills, "died_ms");
        let missing = kills.as_array().map_or(0, Vec::len) - died.len();
        let exit = differences(kills, "died_ms", "exit_ms");
        let cri = differences(kills, "died_ms", "cri_ms");
        let p = |v: &[f64], q| ms(percentile(v, q));
        let x = |poll: Option<f64>| match (poll, percentile(&died, 50.0)) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
            _ => "n/a".into(),
        };
        let _ = writeln!(
            t,
            "| {label} | {}{} | {} | {} | {} | {} | {} / {} | {} / {} | {} | {} |",
            died.len(),
            if missing > 0 {
                format!(" ({missing} missed)")
            } else {
                String::new()
            },
            p(&died, 50.0),
            p(&died, 90.0),
            p(&died, 99.0),
            p(&died, 100.0),
            p(&exit, 50.0),
            p(&exit, 99.0),
            p(&cri, 50.0),
            p(&cri, 99.0),
            x(p1),
            x(p100),
        );
    }
    // The anchors themselves, over every kill of the run.
    let all: Vec<Value> = m["latency"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["kills"].as_array().cloned().unwrap_or_default())
        .collect();
    let all = Value::Array(all);
    for (label, field) in [
        ("anchor: containerd /tasks/exit (exited_at)", "exit_ms"),
        ("anchor: CRI ContainerStatus EXITED", "cri_ms"),
    ] {
        let v = numbers(&all, field);
        let _ = writeln!(
            t,
            "| {label} | {} | {} | {} | {} | {} | | | | |",
            v.len(),
            ms(percentile(&v, 50.0)),
            ms(percentile(&v, 90.0)),
            ms(percentile(&v, 99.0)),
            ms(percentile(&v, 100.0)),
        );
    }
    t
}

/// A row per available mode of its spans, each as p50 / p99 over the mode's row as `spans`
/// reads them; the count is the largest number of measurements. Modes that measured no span
/// have no row.
fn span_table(m: &Value, header: &str, spans: impl Fn(&Value) -> Vec<Vec<f64>>) -> String {
    let columns = header.matches('|').count() - 1;
    let mut t = format!("{header}\n|{}\n", "---|".repeat(columns));
    for row in m["latency"].as_array().into_iter().flatten() {
        if !row["unavailable"].is_null() {
            continue;
        }
        let spans = spans(row);
        if spans.iter().all(Vec::is_empty) {
            continue;
        }
        let count = spans.iter().map(Vec::len).max().unwrap_or(0);
        let _ = write!(t, "| {} | {count} |", row["label"].as_str().unwrap_or("?"));
        for span in &spans {
            let (p50, p99) = (percentile(span, 50.0), percentile(span, 99.0));
            let _ = write!(t, " {} / {} |", ms(p50), ms(p99));
        }
        t.push('\n');
    }
    t
}

/// Where a death's time goes after containerd records it, for the deaths in `rows`:
/// containerd delivering `/tasks/exit` to a subscriber (ours), plegd emitting `ContainerDied`
/// after it, and the Watch stream taking the event to the client. Read on this host's clock,
/// for the same death; plegd's `emitted_at` is to the millisecond.
fn death_spans(rows: &Value) -> Vec<Vec<f64>> {
    vec![
        differences(rows, "exit_arrival_ms", "exit_ms"),
        differences(rows, "emitted_ms", "exit_arrival_ms"),
        differences(rows, "died_ms", "emitted_ms"),
    ]
}

/// Per mode, where a kill -9's time goes ([`death_spans`]).
fn breakdown_table(m: &Value) -> String {
    span_table(
        m,
        "| mode | kills | exited_at → /tasks/exit at a subscriber p50 / p99 | /tasks/exit at a subscriber → ContainerDied emitted p50 / p99 | emitted → ContainerDied at the client p50 / p99 |",
        |row| death_spans(&row["kills"]),
    )
}

/// Per mode, the OOM kills: the same spans as the kill -9s' ([`death_spans`]).
fn oom_table(m: &Value) -> String {
    span_table(
        m,
        "| mode | OOM kills | exited_at → /tasks/exit at a subscriber p50 / p99 | /tasks/exit at a subscriber → ContainerDied emitted p50 / p99 | emitted → ContainerDied at the client p50 / p99 |",
        |row| death_spans(&row["ooms"]),
    )
}

/// Per mode running the eBPF source, the kernel's observation of each kill at a watcher that
/// asked for them, and how far ahead of the confirmed `ContainerDied` it came.
fn kernel_observation_table(m: &Value) -> String {
    span_table(
        m,
        "| mode | kills | kill → kernel observation at the client p50 / p99 | kernel observation → ContainerDied at the client p50 / p99 |",
        |row| {
            let kills = &row["kills"];
            vec![
                numbers(kills, "kernel_ms"),
                differences(kills, "died_ms", "kernel_ms"),
            ]
        },
    )
}

fn start_table(m: &Value) -> String {
    span_table(
        m,
        "| mode | starts | StartContainer returned → ContainerStarted p50 / p99 | /tasks/start → ContainerStarted p50 / p99 |",
        |row| {
            vec![
                numbers(&row["starts"], "from_call_ms"),
                numbers(&row["starts"], "from_task_start_ms"),
            ]
        },
    )
}

fn idle_table(m: &Value) -> String {
    let mut t = String::from(
        "| mode | containers | plegd CPU % | containerd CPU % | containerd added % (− baseline) | plegd RSS MiB | metric series (per-container counters') |\n|---|---|---|---|---|---|---|\n",
    );
    for row in m["idle"].as_array().into_iter().flatten() {
        let f = |k: &str| row[k].as_f64().map_or("".into(), |v| format!("{v:.2}"));
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} |",
            if row["mode"] == "none" {
                "baseline: no plegd"
            } else {
                row["mode"].as_str().unwrap_or("?")
            },
            row["containers"],
            f("plegd_cpu"),
            f("containerd_cpu"),
            f("containerd_added_cpu"),
            row["rss_bytes"]
                .as_f64()
                .map_or("".into(), |b| format!("{:.1}", b / (1 << 20) as f64)),
            row["series"].as_u64().map_or(String::new(), |n| format!(
                "{n} ({})",
                row["container_series"]
            )),
        );
    }
    t
}

fn churn_table(m: &Value) -> String {
    let mut t = String::from(
        "| mode | asked /s | achieved /s | plegd CPU % | CPU ms / lifecycle | relists / lifecycle | runtime calls / lifecycle | kills | ContainerDied after 30 s | never | ContainerDied p50 | p99 |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    // An array of numbers (the module's `numbers` reads a field of each object instead).
    let array = |v: &Value| -> Vec<f64> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .collect()
    };
    for row in m["churn"].as_array().into_iter().flatten() {
        let late = array(&row["late_ms"]);
        let mut died = array(&row["died_ms"]);
        died.extend(&late);
        let lost = row["lost"].as_u64().unwrap_or(0);
        let _ = writeln!(
            t,
            "| {} | {} | {:.1} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row["mode"].as_str().unwrap_or("?"),
            row["rate"],
            row["achieved"].as_f64().unwrap_or(0.0),
            row["plegd_cpu"].as_f64().unwrap_or(0.0),
            per_lifecycle(&row["cpu_ms_per_lifecycle"]),
            per_lifecycle(&row["relists_per_lifecycle"]),
            per_lifecycle(&row["calls_per_lifecycle"]),
            died.len() as u64 + lost,
            late.len(),
            lost,
            ms(percentile(&died, 50.0)),
            ms(percentile(&died, 99.0)),
        );
    }
    t
}

/// A per-lifecycle figure, "n/a" in results written before the bench measured it.
fn per_lifecycle(v: &Value) -> String {
    fixed(v.as_f64(), 2)
}

fn core_table(criterion: &Path) -> String {
    let mut t = String::from(
        "| pods | full relist, nothing changed: per pod | total | every pod changed: per pod | total | listing only dropped: per pod |\n|---|---|---|---|---|---|\n",
    );
    for pods in CORE_PODS {
        let cell = |kind| {
            core_ns_per_pod(criterion, kind, pods).map_or(("n/a".into(), "n/a".into()), |ns| {
                (
                    format!("{ns:.0} ns"),
                    format!("{:.2} ms", ns * pods as f64 / 1e6),
                )
            })
        };
        let (steady, changed, dropped) = (cell("steady"), cell("changed"), cell("dropped"));
        let _ = writeln!(
            t,
            "| {pods} | {} | {} | {} | {} | {} |",
            steady.0, steady.1, changed.0, changed.1, dropped.0
        );
    }
    t
}

fn kernel_table(m: &Value) -> String {
    let k = &m["kernel"];
    let mut t = format!(
        "Exec storm: {} short processes in 4 containers, {:.1} s; ring buffer lost events \
         (`plegd_ringbuf_drops`): {}.\n\n| program | runs | in-kernel ns per run |\n|---|---|---|\n",
        k["execs"],
        k["storm_seconds"].as_f64().unwrap_or(0.0),
        k["ringbuf_drops"]
    );
    for p in k["programs"].as_array().into_iter().flatten() {
        let _ = writeln!(
            t,
            "| {} | {} | {} |",
            p["program"].as_str().unwrap_or("?"),
            p["runs"],
            p["ns_per_run"]
                .as_f64()
                .map_or("n/a".into(), |v| format!("{v:.0}"))
        );
    }
    t
}

fn goals_table(run: &Run) -> String {
    let mut t = String::from("| goal | measured | |\n|---|---|---|\n");
    for g in goals(run) {
        let _ = writeln!(t, "| {} | {} | {} |", g.text, g.measured, verdict(g.met));
    }
    t
}

/// The whole report and the summary of docs/benchmarks.md.
pub fn write(run: &Run) -> Result<(String, String)> {
    let m = run.measured;
    let kind = if run.quick {
        "`--quick` (smoke run)"
    } else {
        "full"
    };
    let mut r = header(run, kind);
    r += &latency_section(m);
    r += &idle_section(m);
    r += &churn_section(m);
    r += &scale_section(run.criterion);
    r += &kernel_section(m);
    let busy = busy::sections(m);
    if !busy.is_empty() {
        let _ = write!(r, "\n{busy}");
    }
    Ok((r, summary(run, kind)))
}

/// The title, what was run where, and the goals.
fn header(run: &Run, kind: &str) -> String {
    let m = run.measured;
    format!(
        "# plegd benchmark report\n\n\
         - date: {}\n- command: `{}` ({kind})\n- git revision: {}\n- kernel: {}\n- cores: {}\n\
         - containerd: {}\n\n\
         Measured side by side in this one run against a private containerd started by the \
         harness; plegd is the release binary run as its own process, events are timed at \
         arrival at a `plegd watch --output json` process. Goals are read against the numbers, \
         not asserted.\n\n## Goals\n\n{}\n",
        run.date,
        run.command_line,
        run.revision,
        m["kernel_release"].as_str().unwrap_or("?"),
        m["cores"],
        m["containerd"].as_str().unwrap_or("?"),
        goals_table(run),
    )
}

/// 1. Latency per mode, where a death's time goes, OOM kills, kernel observations, starts.
fn latency_section(m: &Value) -> String {
    format!(
        "## 1. Latency per mode\n\n{} kill -9s per mode, a random 0-1 s delay before each (kills \
         land anywhere in both pollings' relist periods). ContainerDied latency in ms from the \
         kill; the − columns are ContainerDied minus the anchor measured for the same kill: \
         containerd's `/tasks/exit` (its `exited_at`, from our own Events subscription) and the \
         first CRI `ContainerStatus` showing EXITED (a poller asking as fast as it answers).\n\n\
         {}\n![ContainerDied latency CDF](latency_cdf.png)\n\n### Where a death's time goes \
         (ms)\n\nThe − /tasks/exit column split in two for the same kills: containerd handing its \
         own exit record to a subscriber (our Events subscription; plegd's arrives alike), and \
         what plegd and its Watch stream add after that. A negative second span is a death \
         plegd confirmed before containerd's event reached us.\n\n{}\n\
         ### OOM kills (ms)\n\nThe same spans for containers the kernel's OOM killer ends (a \
         32 MiB limit and a hog; their shell exits a second after its child was killed), one \
         at a time after each mode's kill -9s: an OOM kill is when the shim is busiest.\n\n{}\n\
         ### Kernel observations ahead of confirmation (ms)\n\nIn the modes that run the eBPF \
         source the Watch client also asks for kernel observations \
         (`--kernel-observations`); the first one of each kill's death (its signal or exit \
         status) at the client, from the kill.\n\n{}\n\
         ### Start latency (ms)\n\n{}\n",
        m["kills_per_mode"],
        latency_table(m),
        breakdown_table(m),
        oom_table(m),
        kernel_observation_table(m),
        start_table(m),
    )
}

/// 2. Idle cost.
fn idle_section(m: &Value) -> String {
    format!(
        "## 2. Idle cost\n\nCPU over a {} s window (utime+stime from /proc/<pid>/stat, % of one \
         core) with idle sleepers (pods of up to 10); the baseline is containerd without plegd \
         over the same length of time.\n\n{}\n![Idle CPU](idle_cpu.png)\n\n",
        m["idle_window_s"],
        idle_table(m)
    )
}

/// 3. Churn cost.
fn churn_section(m: &Value) -> String {
    format!(
        "## 3. Churn cost\n\nFor {} s per run, containers are created and started at the asked \
         rate (one pod, every mode at one rate before the next rate), each killed with kill -9 a \
         second after its start and removed once plegd reported it dead; plegd's CPU over the \
         run and the kill → ContainerDied latency under that load. At most {} starts are pending \
         at once: 'achieved' is how many started per second. A ContainerDied not there 30 s \
         after its kill is looked for again at the end of the run ('after 30 s'), or counted as \
         'never'; the percentiles include the late ones.\n\n{}\n",
        m["churn_s"],
        m["churn_starts_in_flight"],
        churn_table(m)
    )
}

/// 4. Scale of the pure core (criterion's estimates).
fn scale_section(criterion: &Path) -> String {
    format!(
        "## 4. Scale of the pure core\n\nA full relist (list, diff, cache) over the in-memory \
         fake runtime, each pod a sandbox and one container; criterion's median \
         (`tests/benches/relist.rs`, group `relist_core`). Beside it, the floor no relist \
         gets under: the listing the runtime handed over, only dropped (every relist drops \
         it); it grows per pod as the records outgrow the CPU's caches.\n\n{}\n",
        core_table(criterion)
    )
}

/// 5. In-kernel cost.
fn kernel_section(m: &Value) -> String {
    format!(
        "## 5. In-kernel cost\n\nRun time per run of each eBPF program of plegd in eBPF-only \
         mode (kernel bpf_stats enabled only during the storm; deltas over it).\n\n{}",
        kernel_table(m)
    )
}

/// What goes into docs/benchmarks.md between its markers.
fn summary(run: &Run, kind: &str) -> String {
    let m = run.measured;
    let busy_tables: String = [
        ("cost", busy::cost_table as fn(&Value) -> String),
        ("throughput", busy::throughput_table),
        ("overload", busy::overload_table),
        ("density", busy::density_table),
    ]
    .into_iter()
    .filter(|(section, _)| m[*section].is_array())
    .map(|(_, table)| table(m) + "\n")
    .collect();
    format!(
        "Last run: {} ({kind}), kernel {}, {} cores, containerd {}, revision {}. Written by \
         `cargo xtask bench`; do not edit by hand.\n\n{}\n{}\n{}\n{busy_tables}{}",
        run.date,
        m["kernel_release"].as_str().unwrap_or("?"),
        m["cores"],
        m["containerd"].as_str().unwrap_or("?"),
        run.revision,
        latency_table(m),
        breakdown_table(m),
        churn_table(m),
        goals_table(run),
    )
}

/// `page` with what lies between the summary markers replaced by `summary`.
pub fn splice_summary(readme: &str, summary: &str) -> Result<String> {
    let (Some(start), Some(end)) = (readme.find(SUMMARY_START), readme.find(SUMMARY_END)) else {
        bail!("{SUMMARY_PAGE} lacks the markers {SUMMARY_START} and {SUMMARY_END}");
    };
    if end < start {
        bail!("{SUMMARY_PAGE}'s bench summary markers are out of order");
    }
    let head = &readme[..start + SUMMARY_START.len()];
    Ok(format!(
        "{head}\n{}\n{}",
        summary.trim_end(),
        &readme[end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0], 90.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn a_relative_time_keeps_its_sign_and_no_negative_zero() {
        let signed: Vec<String> = [
            Some(1.26),
            Some(-0.42),
            Some(-0.04),
            Some(0.0),
            Some(-130.2),
            None,
        ]
        .into_iter()
        .map(signed_ms)
        .collect();
        assert_eq!(signed, ["+1.3", "-0.4", "+0.0", "+0.0", "-130", "n/a"]);
    }

    #[test]
    fn the_summary_replaces_what_is_between_the_markers() {
        let readme = format!("a\n{SUMMARY_START}\nold\n{SUMMARY_END}\nb\n");
        let out = splice_summary(&readme, "new\n").unwrap();
        assert_eq!(out, format!("a\n{SUMMARY_START}\nnew\n{SUMMARY_END}\nb\n"));
        assert!(splice_summary("no markers", "x").is_err());
    }

    #[test]
    fn the_breakdown_splits_each_kill_at_the_subscribers_arrival_and_plegds_emission() {
        let m = serde_json::json!({"latency": [
            {"label": "default", "kills": [
                {"exit_ms": 1.0, "exit_arrival_ms": 2.5, "emitted_ms": 2.7, "died_ms": 3.0},
                {"exit_ms": 1.0, "exit_arrival_ms": 1.5, "emitted_ms": 2.1, "died_ms": 4.5},
                // Without containerd's event the kill counts in neither span.
                {"died_ms": 9.0},
            ]},
            {"label": "cri", "unavailable": "not on 1.6"},
        ]});
        let table = breakdown_table(&m);
        assert!(
            table.contains("| default | 2 | 0.5 / 1.5 | 0.2 / 0.6 | 0.3 / 2.4 |"),
            "{table}"
        );
        assert!(!table.contains("| cri |"), "{table}");
    }

    #[test]
    fn the_relist_goals_read_kills_ooms_and_the_slowest_default_churn() {
        let m = serde_json::json!({
            "latency": [{"mode": "default", "label": "default",
                "kills": [{"exit_ms": 1.0, "exit_arrival_ms": 2.0, "emitted_ms": 2.25, "died_ms": 2.5}],
                "ooms": [{"exit_ms": 1000.0, "exit_arrival_ms": 1001.0, "emitted_ms": 1001.25,
                          "died_ms": 1013.0}]}],
            "churn": [
                {"mode": "default", "rate": 50, "cpu_ms_per_lifecycle": 9.0,
                 "relists_per_lifecycle": 9.0},
                {"mode": "default", "rate": 10, "cpu_ms_per_lifecycle": 1.5,
                 "relists_per_lifecycle": 3.5},
                {"mode": "polling-1s", "rate": 5, "cpu_ms_per_lifecycle": 0.1,
                 "relists_per_lifecycle": 0.1},
            ],
        });
        let run = Run {
            measured: &m,
            criterion: Path::new("/nonexistent"),
            quick: true,
            date: "d",
            command_line: "c",
            revision: "r",
        };
        let goals = goals(&run);
        let goal = |start: &str| {
            goals
                .iter()
                .find(|g| g.text.starts_with(start))
                .unwrap_or_else(|| panic!("no goal {start:?}"))
        };
        let kill = goal("default: kill -9");
        assert_eq!(
            (kill.measured.as_str(), kill.met),
            (
                "p50 +1.5 ms, p99 +1.5 ms (emitted by plegd: p50 +1.2, p99 +1.2)",
                Some(true)
            )
        );
        let oom = goal("default: OOM kill");
        assert_eq!(
            (oom.measured.as_str(), oom.met),
            (
                "p50 +13.0 ms, p99 +13.0 ms (emitted by plegd: p50 +1.2, p99 +1.2)",
                Some(false)
            )
        );
        let added = goal("default: what plegd adds");
        assert!(
            added.measured.starts_with("p50 0.25 ms"),
            "{}",
            added.measured
        );
        assert_eq!(added.met, Some(true));
        let churn = goal("default under churn");
        assert_eq!(
            (churn.measured.as_str(), churn.met),
            ("1.50 ms, 3.50 relists per lifecycle at 10/s", Some(false))
        );
    }

    #[test]
    fn late_deaths_count_in_the_percentiles_and_the_lost_in_the_kills() {
        let m = serde_json::json!({"churn": [
            {"mode": "default", "rate": 10, "achieved": 9.5, "plegd_cpu": 1.0,
             "died_ms": [1.0, 2.0, 3.0], "late_ms": [40000.0], "lost": 2},
            {"mode": "polling-1s", "rate": 10, "achieved": 9.5, "plegd_cpu": 1.0,
             "cpu_ms_per_lifecycle": 0.5, "relists_per_lifecycle": 0.25,
             "calls_per_lifecycle": 1.125, "died_ms": [1.0], "late_ms": [], "lost": 0},
        ]});
        let table = churn_table(&m);
        assert!(
            table.contains(
                "| default | 10 | 9.5 | 1.00 | n/a | n/a | n/a | 6 | 1 | 2 | 2.0 | 40000 |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| polling-1s | 10 | 9.5 | 1.00 | 0.50 | 0.25 | 1.12 | 1 | 0 | 0 |"),
            "{table}"
        );
    }

    #[test]
    fn kernel_observations_have_rows_only_where_measured() {
        let m = serde_json::json!({"latency": [
            {"label": "default", "kills": [
                {"kernel_ms": 0.25, "died_ms": 4.0},
                {"kernel_ms": 0.75, "died_ms": 5.0},
            ]},
            {"label": "polling 1 s", "kills": [{"died_ms": 500.0}]},
        ]});
        let table = kernel_observation_table(&m);
        assert!(
            table.contains("| default | 2 | 0.2 / 0.8 | 3.8 / 4.2 |"),
            "{table}"
        );
        assert!(!table.contains("polling"), "{table}");
    }
}
