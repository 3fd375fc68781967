//! The `plegd` command line.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum};

use crate::{
    api::{self, client::WatchOptions},
    config::{Config, LogFormat, OutputFormat, RunArgs},
};

/// plegd: pod lifecycle events for a Linux node, with kubelet's PLEG semantics.
///
/// plegd lists the containers of a CRI runtime (or containerd's own API), diffs each listing
/// against the previous one and prints ContainerStarted / ContainerDied / ContainerRemoved
/// events per pod, as kubelet's Pod Lifecycle Event Generator does. Kernel probes (eBPF) and
/// the runtime's event streams make it relist just the affected pod within milliseconds; a
/// periodic full relist stays as the safety net.
#[derive(Debug, Parser)]
#[command(name = "plegd", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon: relist the runtime, print lifecycle events on stdout, logs on stderr.
    /// Stops cleanly on SIGTERM or SIGINT.
    Run(Box<RunArgs>),
    /// Report what this node offers plegd (kernel, BTF, tracepoints, cgroup mode, runtime
    /// socket and version, whether the eBPF probes load), which mode `--mode auto` would run
    /// in, and which push sources `plegd run` would choose for this runtime, and why.
    Check(CheckArgs),
    /// Follow a running plegd's events: a live table (or JSON lines), resumed across
    /// disconnects and daemon restarts. Stops on Ctrl-C.
    Watch(WatchArgs),
    /// List a running plegd's cached pods and their containers.
    Pods(ReportArgs),
    /// Print a running plegd's health and event sources. Exit code 0: healthy, 1: unhealthy,
    /// 2: unreachable.
    Health(HealthArgs),
    /// Print a shell completion script for plegd on stdout, e.g.
    /// `plegd completions bash > /etc/bash_completion.d/plegd`.
    Completions(CompletionsArgs),
}

/// Flags of `plegd check`: the settings of `plegd run` it reports for.
#[derive(Debug, Args)]
struct CheckArgs {
    /// plegd run's TOML file: its runtime, endpoint, sources and allow-shared-cri-events are
    /// the ones checked.
    #[arg(long, env = "PLEGD_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Runtime socket to check. [default: the file's, else the first well-known socket that
    /// exists]
    #[arg(long, env = "PLEGD_RUNTIME_ENDPOINT", value_name = "SOCKET")]
    runtime_endpoint: Option<String>,
}

/// Flags of `plegd completions`.
#[derive(Debug, Args)]
struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// The `plegd` command line as clap describes it: what `--help`, the man page
/// (docs/man/plegd.1) and the shell completions are made from.
pub fn command() -> clap::Command {
    Cli::command()
}

/// Where the daemon is.
#[derive(Debug, Args)]
struct ClientArgs {
    /// The daemon's API socket.
    #[arg(long, env = "PLEGD_SOCKET", default_value = crate::api::DEFAULT_SOCKET, value_name = "PATH")]
    socket: PathBuf,
}

/// Flags of `plegd pods` and `plegd health`.
#[derive(Debug, Args)]
struct ReportArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// `text`: a table; `json`: one object, for scripts.
    #[arg(long, value_enum, default_value = "text")]
    output: OutputFormat,
}

/// Flags of `plegd health`.
#[derive(Debug, Args)]
struct HealthArgs {
    #[command(flatten)]
    report: ReportArgs,
    /// Exit 0 whenever plegd answers, healthy or not (1 only when it answers wrongly, 2 when
    /// unreachable): a liveness probe's question. A PLEG that cannot read its runtime is not
    /// mended by restarting plegd; the readiness probe (without --live) says it.
    #[arg(long)]
    live: bool,
}

/// Flags of `plegd watch`.
#[derive(Debug, Args)]
struct WatchArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// `text`: a table; `json`: one object per line.
    #[arg(long, value_enum, default_value = "text")]
    output: OutputFormat,
    /// Start at this sequence number of the current run, if the daemon still has it
    /// (default: new events only).
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    from: u64,
    /// Only pods of this namespace.
    #[arg(long, value_name = "NAMESPACE")]
    pod_namespace: Option<String>,
    /// Only pods with this name.
    #[arg(long, value_name = "NAME")]
    pod_name: Option<String>,
    /// Only the pod with this uid.
    #[arg(long, value_name = "UID")]
    pod_uid: Option<String>,
    /// Only these event types (repeat or comma separate).
    #[arg(long = "type", value_enum, value_delimiter = ',', value_name = "TYPE")]
    types: Vec<EventTypeArg>,
    /// Also show what the kernel saw (exec, exit, OOM kill) as it happens, ahead of the event
    /// that confirms it (type KernelObservation; ObservationUnconfirmed when none does).
    #[arg(long)]
    kernel_observations: bool,
    /// Stream pod syncs instead of events: each pod's whole status when it had events
    /// (coalesced: the latest wins), at every resync, and once when it is gone. --from,
    /// --type and --kernel-observations do not apply.
    #[arg(long, conflicts_with_all = ["from", "types", "kernel_observations"])]
    pod_syncs: bool,
    /// With --pod-syncs: start with a sync of every pod (always done after a reconnection).
    #[arg(long, requires = "pod_syncs")]
    initial: bool,
}

/// Event types as `plegd watch --type` names them.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum EventTypeArg {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    ContainerChanged,
    PodSync,
}

impl From<EventTypeArg> for plegd_proto::v1::EventType {
    fn from(t: EventTypeArg) -> Self {
        match t {
            EventTypeArg::ContainerStarted => Self::ContainerStarted,
            EventTypeArg::ContainerDied => Self::ContainerDied,
            EventTypeArg::ContainerRemoved => Self::ContainerRemoved,
            EventTypeArg::ContainerChanged => Self::ContainerChanged,
            EventTypeArg::PodSync => Self::PodSync,
        }
    }
}

/// Entry point of the `plegd` binary.
pub fn main() -> ExitCode {
    let cli = parse();
    let result = match cli.command {
        Command::Run(args) => run(&args),
        Command::Check(args) => check(args),
        Command::Watch(args) => client(watch(args)),
        Command::Pods(args) => client(pods(args)),
        Command::Health(args) => return health(&args),
        Command::Completions(args) => completions(args.shell),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report_error(&describe(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line, keeping of `plegd run`'s settings only what flags and environment
/// gave: the config file comes between them and the defaults ([`Config::load`]).
fn parse() -> Cli {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let (Command::Run(args), Some(run)) = (&mut cli.command, matches.subcommand_matches("run")) {
        **args = RunArgs::given(run).unwrap_or_else(|e| e.exit());
    }
    cli
}

/// Writes a fatal error to stderr; a stderr nobody reads any more is no reason to panic.
fn report_error(error: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "plegd: {error}");
}

/// An error and its causes on one line, none repeated (anyhow's `{:#}` would print a cause
/// twice when an error's message already ends with it).
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    crate::runtime::transport::with_causes(error.to_string(), error)
}

/// The log filter without `RUST_LOG`: info. h2 logs each request and connection it refuses at
/// debug level, one line per connection: a peer sending garbage would write the log as fast as
/// it connects, so those lines need `RUST_LOG=info,h2::server=debug` (docs/troubleshooting.md);
/// plegd counts refusals and logs them once per burst itself.
const DEFAULT_LOG_FILTER: &str = "info";

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours only for a terminal: logs piped to a file or journald stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A failed write of a log line would be reported with eprintln!, on the same broken
        // stderr, which panics: plegd died when whatever read its stderr went away
        // (`plegd run 2>&1 | head`, a log collector restarting). The line is lost either way.
        .log_internal_errors(false)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn check(args: CheckArgs) -> anyhow::Result<()> {
    init_logging(LogFormat::Text);
    let settings = Config::load(&RunArgs {
        config: args.config,
        runtime_endpoint: args.runtime_endpoint,
        ..RunArgs::default()
    })?;
    let (report, _) = crate::daemon::check::report(&settings);
    print!("{report}");
    Ok(())
}

/// `plegd run`: the settings loaded and logging set up, then the daemon booted
/// ([`crate::daemon::boot`]).
fn run(args: &RunArgs) -> anyhow::Result<()> {
    let config = Config::load(args)?;
    init_logging(config.log_format);
    Ok(crate::daemon::boot::run(&config)?)
}

/// The completion script of `plegd` for `shell`.
fn completion_script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command(), "plegd", &mut script);
    script
}

/// Prints the completion script; a reader that stops early (`| head`) is no error.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout()
        .lock()
        .write_all(&completion_script(shell))
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing the completion script"))
        }
        _ => Ok(()),
    }
}

/// Runs a client command on a small runtime.
fn client<T>(command: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(command)
}

async fn watch(args: WatchArgs) -> anyhow::Result<()> {
    let options = WatchOptions {
        socket: args.client.socket,
        output: args.output,
        from: args.from,
        pod_namespace: args.pod_namespace.unwrap_or_default(),
        pod_name: args.pod_name.unwrap_or_default(),
        pod_uid: args.pod_uid.unwrap_or_default(),
        types: args.types.into_iter().map(Into::into).collect(),
        kernel_observations: args.kernel_observations,
        pod_syncs: args.pod_syncs,
        initial_syncs: args.initial,
    };
    let (mut out, mut notes) = (std::io::stdout().lock(), std::io::stderr());
    tokio::select! {
        result = api::client::watch(&options, &mut out, &mut notes) => Ok(result?),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

async fn pods(args: ReportArgs) -> anyhow::Result<()> {
    let out = &mut std::io::stdout().lock();
    Ok(api::client::pods(&args.client.socket, args.output, out).await?)
}

fn health(args: &HealthArgs) -> ExitCode {
    let report = &args.report;
    let checked = client(async {
        let out = &mut std::io::stdout().lock();
        Ok(api::client::health(&report.client.socket, report.output, out).await)
    });
    match checked {
        Ok(Ok(healthy)) if healthy || args.live => ExitCode::SUCCESS,
        Ok(Ok(_)) => ExitCode::from(1),
        Ok(Err(e)) => {
            report_error(&describe(&e));
            ExitCode::from(if e.is_unreachable() { 2 } else { 1 })
        }
        Err(e) => {
            report_error(&describe(e.as_ref()));
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn completions_are_printed_for_bash_zsh_and_fish() {
        for shell in ["bash", "zsh", "fish"] {
            let cli = Cli::try_parse_from(["plegd", "completions", shell]).unwrap();
            let Command::Completions(args) = cli.command else {
                panic!("not completions: {cli:?}");
            };
            let script = String::from_utf8(completion_script(args.shell)).unwrap();
            assert!(script.contains("relist-period"), "{shell}: {script}");
        }
        assert!(Cli::try_parse_from(["plegd", "completions", "tcsh"]).is_err());
    }

    #[test]
    fn the_default_log_filter_parses() {
        tracing_subscriber::EnvFilter::try_new(DEFAULT_LOG_FILTER).unwrap();
    }
}
