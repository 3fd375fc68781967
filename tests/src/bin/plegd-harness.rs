//! `plegd-harness`: the private containerd and the demo, for `cargo xtask containerd|demo`;
//! `node prepare|check` inside `cargo xtask node`'s VM.
//! (xtask itself stays free of gRPC dependencies so it builds before `cargo xtask setup`.)

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use plegd_tests::{ContainerdOptions, PrivateContainerd, containerd};

#[derive(Debug, Parser)]
#[command(name = "plegd-harness", about = "plegd's real-runtime harness")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Manage a private containerd (own config, state and sockets under the temp dir).
    Containerd {
        #[command(subcommand)]
        action: ContainerdAction,
        /// Instance name (its directory under $TMPDIR/plegd-harness).
        #[arg(long, default_value = "dev", global = true)]
        name: String,
    },
    /// Run plegd against a private containerd while real containers start, die and go.
    Demo {
        /// The plegd binary to run.
        #[arg(long, default_value = "target/debug/plegd")]
        plegd: std::path::PathBuf,
        /// How long to let plegd catch up between steps.
        #[arg(long, default_value = "2s", value_parser = parse_seconds)]
        pause: std::time::Duration,
    },
    /// Inside `cargo xtask node`'s VM only: `prepare` writes the node containerd's config (the
    /// systemd cgroup driver), `check` runs the node check against the node's containerd and
    /// the plegd its unit runs.
    Node {
        #[command(subcommand)]
        action: NodeAction,
    },
    /// Build plegd's OCI image tarball (for `ctr images import`) from a plegd binary.
    Image {
        /// The plegd binary to put in it.
        #[arg(long)]
        plegd: std::path::PathBuf,
        /// The tarball to write.
        #[arg(long)]
        out: std::path::PathBuf,
        /// The image's name.
        #[arg(long, default_value = plegd_tests::image::PLEGD_IMAGE)]
        name: String,
    },
}

fn parse_seconds(text: &str) -> Result<std::time::Duration, String> {
    text.trim_end_matches('s')
        .parse::<f64>()
        .ok()
        .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("invalid duration {text:?}: expected seconds, e.g. 2s"))
}

#[derive(Debug, Subcommand)]
enum NodeAction {
    /// Write /etc/containerd/config.toml for the containerd in PATH.
    Prepare {
        /// The OCI runtime containerd's runc shim runs (its `BinaryName`).
        #[arg(long, value_enum, default_value_t)]
        oci_runtime: plegd_tests::node::OciRuntime,
    },
    /// Run the checks, one `@@xtask check` line each.
    Check {
        /// Skip the eBPF-only round.
        #[arg(long)]
        quick: bool,
        /// Lifecycles of the churn audit (0: none).
        #[arg(long, default_value_t = 60)]
        churn: usize,
        /// The churn's seed (default: the clock's).
        #[arg(long)]
        seed: Option<u64>,
        /// The OCI runtime `prepare` configured.
        #[arg(long, value_enum, default_value_t)]
        oci_runtime: plegd_tests::node::OciRuntime,
    },
}

#[derive(Debug, Subcommand)]
enum ContainerdAction {
    /// Start it in the background and print its socket; `stop` ends it.
    Start,
    /// Stop it and remove everything it left (processes, mounts, cgroups, sockets, files).
    Stop,
    /// Say whether it runs, with its pid and socket.
    Status,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("plegd-harness: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plegd-harness: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo { plegd, pause } => plegd_tests::demo::run(&plegd, pause).await?,
        Command::Node { action } => match action {
            NodeAction::Prepare { oci_runtime } => {
                let version = plegd_tests::node::prepare(oci_runtime)?;
                println!(
                    "containerd {version}: wrote its config (SystemdCgroup = true, {})",
                    oci_runtime.name()
                );
            }
            NodeAction::Check {
                quick,
                churn,
                seed,
                oci_runtime,
            } => {
                let seed = match seed {
                    Some(seed) => seed,
                    None => plegd_tests::soak::seed_from_env()?,
                };
                let plan = plegd_tests::node::Plan {
                    quick,
                    churn,
                    seed,
                    oci_runtime,
                };
                plegd_tests::node::check(plan).await?;
            }
        },
        Command::Image { plegd, out, name } => {
            let built = plegd_tests::image::build_plegd_image(&plegd, &name, &out)?;
            let libraries: Vec<String> = built
                .libraries
                .iter()
                .map(|l| l.display().to_string())
                .collect();
            let libraries = if libraries.is_empty() {
                "no shared libraries (static)".to_owned()
            } else {
                libraries.join(", ")
            };
            eprintln!(
                "image {name}: {} ({:.1} MiB; plegd and {libraries})",
                built.tarball.display(),
                built.size as f64 / f64::from(1 << 20),
            );
            println!("{}", built.tarball.display());
        }
        Command::Containerd { action, name } => {
            let options = ContainerdOptions::named(&name);
            match action {
                ContainerdAction::Start => {
                    if let Some((pid, socket)) = containerd::instance_status(&options) {
                        println!(
                            "containerd {name} already running (pid {pid}), socket {}",
                            socket.display()
                        );
                        return Ok(());
                    }
                    let instance = PrivateContainerd::start(&options).await?;
                    let pid = instance.pid().unwrap_or_default();
                    let version = instance.version();
                    let paths = instance.detach();
                    println!("containerd {name} started (pid {pid}, containerd {version})");
                    println!("  socket: {}", paths.socket().display());
                    println!("  log:    {}", paths.log().display());
                    println!(
                        "  images: localhost/busybox:latest, localhost/pause:latest (namespaces k8s.io, plegd-native)"
                    );
                }
                ContainerdAction::Stop => {
                    if containerd::stop_instance(&options) {
                        println!("containerd {name} stopped and cleaned up");
                    } else {
                        println!("containerd {name} is not running");
                    }
                }
                ContainerdAction::Status => match containerd::instance_status(&options) {
                    Some((pid, socket)) => println!(
                        "containerd {name} running (pid {pid}), socket {}",
                        socket.display()
                    ),
                    None => println!("containerd {name} is not running"),
                },
            }
        }
    }
    Ok(())
}
