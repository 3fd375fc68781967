//! What a clean shutdown saves so the next start continues the same run: the last reading of
//! the runtime (the diff's old state), the last event sequence and the event history.
//!
//! With it, the first relist after a restart emits only what changed while plegd was down
//! (a container that died then is one `ContainerDied`, not a burst of events for every
//! container), and watchers resume from their next sequence as after a disconnect.
//!
//! - **Only a clean shutdown saves**, after every generated event was published; a crash leaves
//!   nothing, and the next start is a new run (a stale state could reuse sequence numbers).
//! - **Taken once**: the files are removed as they are read. If they cannot be removed the state
//!   is not used, for the same reason.
//! - **Same runtime only**: a state saved for another runtime, endpoint or namespaces is ignored.
//!
//! Files in the state directory (0700): `history.pb` (length-delimited `plegd.v1.Event`s),
//! written first, then `state.json`, each atomically (written aside, then renamed).

use std::{
    fs,
    io::{ErrorKind, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use plegd_proto::v1 as pb;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    api::convert,
    config::Config,
    pleg::{PodLifecycleEvent, PodRecords, SavedRun},
    runtime::{RuntimeKind, transport::endpoint_name},
};

const STATE_FILE: &str = "state.json";
const HISTORY_FILE: &str = "history.pb";
const FORMAT_VERSION: u32 = 1;

/// `state.json`: the PLEG's [`SavedRun`] without its history (which is `history.pb`), the
/// runtime it was read from, and where the OTLP export was in it.
#[derive(Serialize, Deserialize)]
struct StateFile<Records> {
    version: u32,
    /// Which runtime the records were read from (kind, endpoint, namespaces).
    runtime: String,
    run_id: u64,
    /// Sequence of the last published event.
    sequence: u64,
    records: Records,
    /// Sequence of the last event the OTLP receiver acknowledged, when events were exported:
    /// where the export resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exported: Option<u64>,
}

/// The state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a plegd state file: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: not a plegd state file: format version {version}")]
    Version { path: PathBuf, version: u32 },
    #[error("{path}: not a plegd state file: {source}")]
    History {
        path: PathBuf,
        #[source]
        source: HistoryError,
    },
}

/// A history file that does not continue the saved state.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(transparent)]
    Decode(#[from] prost::DecodeError),
    #[error("sequence {sequence} out of order")]
    OutOfOrder { sequence: u64 },
    #[error("ends at sequence {last}, the state at {expected}")]
    WrongEnd { last: u64, expected: u64 },
    #[error("event {sequence}: {source}")]
    Event {
        sequence: u64,
        #[source]
        source: convert::NotAnEvent,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Saves `run` in `dir` (created 0700), read from `runtime`, with the OTLP export's place in it
/// (`exported`).
pub fn save(
    dir: &Path,
    runtime: &str,
    run: &SavedRun,
    exported: Option<u64>,
) -> Result<(), StateError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_error(dir))?;
    let mut events = Vec::new();
    for event in &run.history {
        // Writing into a Vec cannot fail.
        let _ = convert::event(event, run.run_id).encode_length_delimited(&mut events);
    }
    write_atomically(&dir.join(HISTORY_FILE), &events)?;
    let state = serde_json::to_vec(&StateFile {
        version: FORMAT_VERSION,
        runtime: runtime.to_owned(),
        run_id: run.run_id,
        sequence: run.sequence,
        records: &run.records,
        exported,
    })
    .map_err(|source| StateError::Json {
        path: dir.join(STATE_FILE),
        source,
    })?;
    write_atomically(&dir.join(STATE_FILE), &state)
}

/// Takes the run saved in `dir` for `runtime`, with the OTLP export's place in it: `None` when
/// there is none, or it was saved for another runtime. The files are removed either way.
pub fn take(dir: &Path, runtime: &str) -> Result<Option<(SavedRun, Option<u64>)>, StateError> {
    let state_path = dir.join(STATE_FILE);
    let history_path = dir.join(HISTORY_FILE);
    let state = match fs::read(&state_path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(&state_path)(e)),
    };
    let history = match fs::read(&history_path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(io_error(&history_path)(e)),
    };
    // Removed before use: if that fails, the state must not be used (a later crash would
    // bring the same run back with sequences already handed out).
    for path in [&history_path, &state_path] {
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(path)(e)),
        }
    }
    let state: StateFile<PodRecords> =
        serde_json::from_slice(&state).map_err(|source| StateError::Json {
            path: state_path.clone(),
            source,
        })?;
    if state.version != FORMAT_VERSION {
        return Err(StateError::Version {
            path: state_path,
            version: state.version,
        });
    }
    if state.runtime != runtime {
        return Ok(None);
    }
    let history = decode_history(history.as_deref().unwrap_or_default(), state.sequence).map_err(
        |source| StateError::History {
            path: history_path,
            source,
        },
    )?;
    let run = SavedRun {
        run_id: state.run_id,
        sequence: state.sequence,
        records: state.records,
        history,
    };
    Ok(Some((run, state.exported)))
}

/// The events of a history file, checked to be in order and to end at `last`.
fn decode_history(bytes: &[u8], last: u64) -> Result<Vec<Arc<PodLifecycleEvent>>, HistoryError> {
    decode_messages(bytes, last)?
        .iter()
        .map(|event| {
            convert::event_from_pb(event)
                .map(Arc::new)
                .map_err(|source| HistoryError::Event {
                    sequence: event.sequence,
                    source,
                })
        })
        .collect()
}

/// The messages of a history file, checked to be in order and to end at `last`.
fn decode_messages(mut bytes: &[u8], last: u64) -> Result<Vec<pb::Event>, HistoryError> {
    let mut events: Vec<pb::Event> = Vec::new();
    while !bytes.is_empty() {
        let event = pb::Event::decode_length_delimited(&mut bytes)?;
        if events
            .last()
            .is_some_and(|e| e.sequence + 1 != event.sequence)
        {
            return Err(HistoryError::OutOfOrder {
                sequence: event.sequence,
            });
        }
        events.push(event);
    }
    match events.last() {
        Some(e) if e.sequence != last => Err(HistoryError::WrongEnd {
            last: e.sequence,
            expected: last,
        }),
        _ => Ok(events),
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let written = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .and_then(|()| fs::rename(&temporary, path));
    written.map_err(|e| {
        let _ = fs::remove_file(&temporary);
        io_error(path)(e)
    })
}

/// What the saved records were read from: a state saved for anything else is not used.
pub fn runtime_identity(config: &Config, socket: Option<&Path>) -> String {
    let endpoint = socket.map_or_else(|| "-".to_owned(), endpoint_name);
    match config.runtime {
        RuntimeKind::Cri => format!("cri {endpoint}"),
        RuntimeKind::Containerd => {
            format!("containerd {endpoint} {}", config.namespaces.join(","))
        }
    }
}

/// The run a clean shutdown saved for `runtime`, if any, to continue, with the OTLP export's
/// place in it: a damaged state is reported and started over.
pub fn restore(config: &Config, runtime: &str) -> Option<(SavedRun, Option<u64>)> {
    let dir = config.state_dir.as_deref()?;
    match take(dir, runtime) {
        Ok(Some((run, exported))) => {
            info!(
                run_id = format!("{:x}", run.run_id),
                sequence = run.sequence,
                pods = run.records.len(),
                history = run.history.len(),
                "continuing the run saved at the last shutdown"
            );
            Some((run, exported))
        }
        Ok(None) => None,
        Err(e) => {
            warn!("not using the saved state: {e}; starting a new run");
            None
        }
    }
}

/// Saves the run for the next start, with the OTLP export's place in it (`exported`); a
/// failure only costs that start its continuity.
pub fn keep(config: &Config, runtime: &str, run: &SavedRun, exported: Option<u64>) {
    let Some(dir) = config.state_dir.as_deref() else {
        return;
    };
    match save(dir, runtime, run, exported) {
        Ok(()) => info!(
            dir = %dir.display(),
            sequence = run.sequence,
            "saved the run for the next start"
        ),
        Err(e) => warn!("cannot save the run: {e}; the next start is a new run"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::pleg::{ContainerRecord, Containers, PodRecord, PodUid};

    const RUNTIME: &str = "Cri unix:///run/containerd/containerd.sock";

    /// A run at `sequence` whose history holds the events `kept`.
    fn run(sequence: u64, kept: impl IntoIterator<Item = u64>) -> SavedRun {
        let container = ContainerRecord {
            attempt: 2,
            created_at: Some(std::time::UNIX_EPOCH),
            finished_at: Some(std::time::SystemTime::now()),
            ..crate::runtime::testing::exited("c1", "app", 137, "Error")
        };
        let pod = PodRecord {
            uid: PodUid("u1".into()),
            namespace: "default".into(),
            name: "web".into(),
            containers: Containers::from([(container.id.clone(), container)]),
            labels: Default::default(),
            annotations: Default::default(),
        };
        SavedRun {
            run_id: 42,
            sequence,
            records: BTreeMap::from([(pod.uid.clone(), pod)]),
            history: kept
                .into_iter()
                .map(|sequence| Arc::new(crate::runtime::testing::event(sequence, "web")))
                .collect(),
        }
    }

    #[test]
    fn a_saved_run_is_taken_back_once() {
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().join("state");
        let saved = run(7, 3..=7);
        save(&state_dir, RUNTIME, &saved, Some(5)).unwrap();
        let mode = |p: &Path| {
            use std::os::unix::fs::PermissionsExt as _;
            fs::metadata(p).unwrap().permissions().mode() & 0o777
        };
        assert_eq!(mode(&state_dir), 0o700);
        assert_eq!(mode(&state_dir.join(STATE_FILE)), 0o600);

        let (restored, exported) = take(&state_dir, RUNTIME).unwrap().unwrap();
        assert_eq!(restored, saved, "every field comes back");
        assert_eq!(exported, Some(5));
        assert_eq!(
            restored
                .history
                .iter()
                .map(|e| e.sequence)
                .collect::<Vec<_>>(),
            [3, 4, 5, 6, 7]
        );
        // Taken: a second start (as after a crash) is a new run.
        assert_eq!(take(&state_dir, RUNTIME).unwrap(), None);
        assert_eq!(fs::read_dir(&state_dir).unwrap().count(), 0);
    }

    /// `state.json` as earlier releases wrote it is read back: the format is the file's, not
    /// the PLEG's type.
    #[test]
    fn a_state_file_of_the_same_format_version_is_read() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join(STATE_FILE),
            r#"{"version":1,"runtime":"R","run_id":42,"sequence":0,"records":{},"exported":0}"#,
        )
        .unwrap();
        let (run, exported) = take(dir.path(), "R").unwrap().unwrap();
        assert_eq!(
            run,
            SavedRun {
                run_id: 42,
                ..SavedRun::default()
            }
        );
        assert_eq!(exported, Some(0));
    }

    #[test]
    fn another_runtimes_state_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), RUNTIME, &run(0, []), None).unwrap();
        assert_eq!(
            take(dir.path(), "Containerd unix:///elsewhere").unwrap(),
            None
        );
        assert_eq!(take(dir.path(), RUNTIME).unwrap(), None);
    }

    #[test]
    fn damaged_files_are_errors_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        // A history that does not end where the state does.
        save(dir.path(), RUNTIME, &run(7, 3..=6), None).unwrap();
        let error = take(dir.path(), RUNTIME).unwrap_err();
        assert!(
            error
                .to_string()
                .ends_with("not a plegd state file: ends at sequence 6, the state at 7"),
            "{error}"
        );
        assert!(matches!(
            error,
            StateError::History {
                source: HistoryError::WrongEnd {
                    last: 6,
                    expected: 7
                },
                ..
            }
        ));
        // Not JSON.
        fs::write(dir.path().join(STATE_FILE), "{").unwrap();
        assert!(matches!(
            take(dir.path(), RUNTIME),
            Err(StateError::Json { .. })
        ));
        assert_eq!(take(dir.path(), RUNTIME).unwrap(), None);
    }

    #[test]
    fn an_undecodable_history_keeps_protobufs_error() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), RUNTIME, &run(7, 3..=7), None).unwrap();
        // A length prefix promising more bytes than follow.
        fs::write(dir.path().join(HISTORY_FILE), [0x10, 0x08]).unwrap();
        let error = take(dir.path(), RUNTIME).unwrap_err();
        assert!(
            matches!(
                &error,
                StateError::History {
                    source: HistoryError::Decode(_),
                    ..
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn an_unwritable_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, "").unwrap();
        let error = save(&file.join("state"), RUNTIME, &run(0, []), None).unwrap_err();
        assert!(
            error.to_string().starts_with(&file.display().to_string()),
            "{error}"
        );
    }
}
