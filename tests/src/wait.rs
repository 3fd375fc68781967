//! Bounded waits: poll an awaited condition until it holds or a deadline passes.

use std::{fmt::Debug, future::Future, time::Duration};

/// The condition did not hold in time; carries the last observation.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {what}; last seen: {last}")]
pub struct Timeout {
    pub what: String,
    pub timeout: Duration,
    pub last: String,
}

/// Calls `probe` until it returns `Ok(Some(value))`, at most for `timeout`. `Ok(None)` and
/// errors mean "not yet"; the last one is reported on timeout.
pub async fn until<T, E, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T, Timeout>
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => "condition false".to_owned(),
            Err(e) => format!("{e:?}"),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(Timeout {
                what: what.to_owned(),
                timeout,
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_value_once_the_condition_holds() {
        let mut calls = 0;
        let value = until("third call", Duration::from_secs(1), || {
            calls += 1;
            let n = calls;
            async move { Ok::<_, ()>((n == 3).then_some(n)) }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn times_out_with_the_last_error() {
        let err = until("never", Duration::from_millis(100), || async {
            Err::<Option<()>, _>("boom")
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
    }
}
