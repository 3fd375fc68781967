//! Scratch: K-in-flight churn for the lead's own measurements (not committed).
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use plegd_tests::{
    Node,
    bench::Plegd,
    cri::{ContainerSpec, Pod},
    process,
};

async fn lifecycle(node: Arc<Node>, pod: Pod, n: usize) -> anyhow::Result<String> {
    let id = node
        .cri
        .create_container(&pod, &ContainerSpec::sleeper(&format!("c{n}")))
        .await?;
    node.cri.start_container(&id).await?;
    loop {
        let s = node.cri.container_status(&id).await?;
        if s.state == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut tries = 0;
    let pid = loop {
        match node.tasks.init_pid(&id).await {
            Ok(p) => break p,
            Err(e) if tries < 100 => {
                tries += 1;
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e),
        }
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    loop {
        let s = node.cri.container_status(&id).await?;
        if s.state == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.cri.remove_container(&id).await?;
    Ok(id)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn scratch() -> anyhow::Result<()> {
    let k: usize = std::env::var("K").map(|v| v.parse().unwrap()).unwrap_or(2);
    let n: usize = std::env::var("N").map(|v| v.parse().unwrap()).unwrap_or(64);
    let extra: Vec<String> = std::env::var("ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    let node = Arc::new(Node::start().await?);
    let pod = node.cri.run_pod("shared").await?;
    let bin = process::plegd_binary()?;
    let dir = std::path::PathBuf::from("/tmp/lead/run");
    let _ = std::fs::remove_dir_all(&dir);
    let plegd = Plegd::start(&bin, &node.containerd, &dir, &extra)?;
    let watch = plegd.watch()?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = plegd.metric_series("plegd_runtime_calls_total")?;
    let relists_before = plegd.metric_series("plegd_relists_total")?;
    let cpu0 = plegd_tests::bench::cpu_time(plegd.pid());
    let began = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(k));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let permit = sem.clone().acquire_owned().await?;
        let (node, pod) = (node.clone(), pod.clone());
        set.spawn(async move {
            let r = lifecycle(node, pod, i).await;
            drop(permit);
            r
        });
    }
    let mut ids = Vec::new();
    while let Some(r) = set.join_next().await {
        ids.push(r??);
    }
    let wall = began.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = plegd_tests::bench::cpu_time(plegd.pid()) - cpu0;
    let after = plegd.metric_series("plegd_runtime_calls_total")?;
    let relists_after = plegd.metric_series("plegd_relists_total")?;
    println!(
        "K={k} N={n} wall={wall:?} rate={:.2}/s cpu/lifecycle={:.2}ms",
        n as f64 / wall.as_secs_f64(),
        cpu.as_secs_f64() * 1000.0 / n as f64
    );
    let mut total = 0.0;
    for (series, v) in &after {
        let d = v - before.get(series).copied().unwrap_or_default();
        total += d;
        println!("  {series:?} {:.2}", d / n as f64);
    }
    println!("  total calls/lifecycle {:.2}", total / n as f64);
    for (series, v) in &relists_after {
        let d = v - relists_before.get(series).copied().unwrap_or_default();
        println!("  relists {series:?} {:.2}", d / n as f64);
    }
    let records = watch.records();
    let mut missing = 0;
    for id in &ids {
        let types: Vec<_> = records
            .iter()
            .filter_map(|r| match r {
                plegd_tests::audit::Record::Event(e) if e.container_id == *id => {
                    Some(e.event_type.clone())
                }
                _ => None,
            })
            .collect();
        if types.len() < 3 {
            missing += 1;
            println!("  {id}: {types:?}");
        }
    }
    println!("  lifecycles with <3 events: {missing}");
    plegd.stop();
    node.cri.stop_pod(&pod).await?;
    node.cri.remove_pod(&pod).await?;
    Ok(())
}
