//! The gRPC plumbing both backends and the event streams share: dialling a unix socket, the
//! per-call deadline, and error text that keeps tonic's hidden causes. Knows no backend.

use std::{
    fs::FileType, future::Future, os::unix::fs::FileTypeExt as _, path::Path, time::Duration,
};

use tonic::transport::{Channel, Endpoint};

use crate::{
    base::metrics::RuntimeCalls,
    pleg::{CallCode, RuntimeError},
};

/// Largest response accepted, as kubelet's CRI client (tonic's default of 4 MiB is too small
/// for a full list on a busy node).
pub(crate) const MAX_MESSAGE_SIZE: usize = 16 << 20;

/// How to display a socket in logs and errors.
pub(crate) fn endpoint_name(socket: &Path) -> String {
    format!("unix://{}", socket.display())
}

/// `text` followed by `error`'s causes, `text: cause: cause` (tonic's transport errors keep the
/// useful part, e.g. "No such file or directory", in their source chain); a cause the text
/// already ends with is not repeated.
pub(crate) fn with_causes(mut text: String, error: &dyn std::error::Error) -> String {
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Dials a unix socket. Waits for the connection (so a missing socket fails here, naming it),
/// within `timeout`; tonic's channel redials by itself if the runtime restarts later.
pub(crate) async fn connect_unix(
    socket: &Path,
    timeout: Duration,
) -> Result<Channel, RuntimeError> {
    let endpoint = endpoint_name(socket);
    let path = socket;
    let socket = socket.to_owned();
    // tonic needs a URI; the connector ignores it.
    let uri = Endpoint::from_static("http://[::]:50051");
    let connecting = uri.connect_with_connector(tower::service_fn(move |_| {
        let socket = socket.clone();
        async move {
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::connect(socket).await?,
            ))
        }
    }));
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(channel)) => Ok(channel),
        // connect(2) says only "Connection refused" for a directory or a regular file.
        Ok(Err(source)) => match std::fs::metadata(path)
            .ok()
            .and_then(|m| not_a_socket(m.file_type()))
        {
            Some(what) => Err(RuntimeError::NotASocket { endpoint, what }),
            None => Err(RuntimeError::Connect {
                endpoint,
                source: source.into(),
            }),
        },
        Err(_) => Err(RuntimeError::Timeout {
            endpoint,
            call: "connect",
            timeout,
        }),
    }
}

/// What a file that is not a socket is, for a message; `None` for a socket.
fn not_a_socket(file_type: FileType) -> Option<&'static str> {
    if file_type.is_socket() {
        None
    } else if file_type.is_dir() {
        Some("a directory")
    } else if file_type.is_file() {
        Some("a regular file")
    } else {
        Some("a special file")
    }
}

/// How a backend makes its calls: to which endpoint, under which deadline, counted where.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    pub(crate) endpoint: String,
    pub(crate) timeout: Duration,
    pub(crate) calls: RuntimeCalls,
}

impl Caller {
    /// Runs one gRPC call under the call deadline, naming the endpoint and the call on
    /// failure.
    pub(crate) async fn call<T>(
        &self,
        call: &'static str,
        request: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, RuntimeError> {
        self.calls.count(call);
        match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(call_error(self.endpoint.clone(), call, status)),
            Err(_) => Err(RuntimeError::Timeout {
                endpoint: self.endpoint.clone(),
                call,
                timeout: self.timeout,
            }),
        }
    }

    /// One gRPC call held open until the runtime answers it (a wait for an exit): counted as
    /// it is made, not when first polled; under no deadline, the caller bounds what waits on
    /// it.
    pub(crate) fn open_call<T, F>(
        &self,
        call: &'static str,
        request: F,
    ) -> impl Future<Output = Result<T, RuntimeError>> + use<T, F>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.calls.count(call);
        let endpoint = self.endpoint.clone();
        async move {
            request
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| call_error(endpoint, call, status))
        }
    }
}

/// A gRPC status a runtime answered `call` with, in the PLEG's terms: the codes its callers act
/// on by name, the status kept as the cause.
pub(crate) fn call_error(
    endpoint: String,
    call: &'static str,
    status: tonic::Status,
) -> RuntimeError {
    let code = match status.code() {
        tonic::Code::NotFound => CallCode::NotFound,
        tonic::Code::Unimplemented => CallCode::Unsupported,
        _ => CallCode::Other,
    };
    RuntimeError::Call {
        endpoint,
        call,
        code,
        source: status.into(),
    }
}

/// A call's result with NotFound as `None`: the object vanished between a list and a status
/// call, which is no error.
pub(crate) fn found<T>(result: Result<T, RuntimeError>) -> Result<Option<T>, RuntimeError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(RuntimeError::Call {
            code: CallCode::NotFound,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_or_a_file_is_named_for_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let listener = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
        let kind = |path: &Path| not_a_socket(std::fs::metadata(path).unwrap().file_type());
        assert_eq!(kind(dir.path()), Some("a directory"));
        assert_eq!(kind(&file), Some("a regular file"));
        assert_eq!(kind(Path::new("/dev/null")), Some("a special file"));
        assert_eq!(kind(&dir.path().join("sock")), None);
        drop(listener);
    }

    #[test]
    fn not_found_is_recognised_only_for_call_errors() {
        let answered = |status| call_error("e".into(), "ContainerStatus", status);
        let gone = answered(tonic::Status::not_found("gone"));
        let failed = answered(tonic::Status::unavailable("down"));
        assert!(matches!(found::<()>(Err(gone)), Ok(None)));
        assert!(found::<()>(Err(failed)).is_err());
        assert!(matches!(found(Ok(1)), Ok(Some(1))));
    }

    /// The codes callers act on are named; the status stays the cause, its text in the error's.
    #[test]
    fn a_status_maps_to_the_code_callers_act_on_and_stays_the_cause() {
        let cases = [
            (tonic::Status::not_found("gone"), CallCode::NotFound),
            (
                tonic::Status::unimplemented("no tasks"),
                CallCode::Unsupported,
            ),
            (tonic::Status::unavailable("down"), CallCode::Other),
            (tonic::Status::deadline_exceeded("late"), CallCode::Other),
        ];
        for (status, want) in cases {
            let message = status.message().to_owned();
            let error = call_error("unix:///run/c.sock".into(), "Tasks.Get", status);
            let RuntimeError::Call { code, .. } = &error else {
                panic!("{error:?}");
            };
            assert_eq!(*code, want, "{error}");
            assert!(
                error
                    .to_string()
                    .starts_with("unix:///run/c.sock: Tasks.Get: ")
            );
            assert!(error.to_string().contains(&message), "{error}");
            let cause = std::error::Error::source(&error).expect("a cause");
            assert!(cause.downcast_ref::<tonic::Status>().is_some(), "{cause:?}");
        }
    }
}
