//! The TOML file (`--config`): its keys are the flags' names, its values read with the flags'
//! syntax, and its errors name their line and column.

use std::{path::Path, time::Duration};

use serde::{Deserialize, Deserializer};

use super::{ConfigError, RunArgs, parse_duration};

pub(super) fn read_file(path: &Path) -> Result<RunArgs, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(path, &text)
}

pub(super) fn parse_file(path: &Path, text: &str) -> Result<RunArgs, ConfigError> {
    toml::from_str(text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source: Box::new(source),
    })
}

/// A file's duration, with [`parse_duration`]'s syntax.
pub(super) fn duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_duration(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// A file's value of a type that parses from a string the way its flag does.
pub(super) fn from_str<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let text = String::deserialize(deserializer)?;
    text.parse().map(Some).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use std::{io::Write as _, time::Duration};

    use crate::config::{args::given, *};

    #[test]
    fn the_file_is_read_the_way_flags_are() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "relist-period = \"1s 500ms\"\n\
             runtime = \"containerd\"\n\
             sources = [\"ebpf\"]\n\
             mode = \"ebpf\"\n\
             emit-changed = true"
        )
        .unwrap();
        let path = file.path().to_str().unwrap();
        let from_file = Config::load(&given(&["run", "--config", path])).unwrap();
        let from_flags = Config::load(&given(&[
            "run",
            "--relist-period",
            "1s 500ms",
            "--runtime",
            "containerd",
            "--sources",
            "ebpf",
            "--mode",
            "ebpf",
            "--emit-changed",
        ]))
        .unwrap();
        assert_eq!(from_file, from_flags);
        assert_eq!(from_file.relist_period, Duration::from_millis(1500));
    }

    #[test]
    fn a_bad_file_names_its_line_and_column() {
        let cases = [
            // Syntax: an unquoted duration.
            (
                "relist-period = \"1s\"\nrelist-threshold = 3m",
                "line 2, column 20",
            ),
            // Type: a string where a number goes.
            (
                "watch-queue = 5\nevent-history = \"many\"",
                "line 2, column 17",
            ),
            // Value: a duration humantime does not read.
            ("\nslow-relist-period = \"soon\"", "line 2, column 22"),
            // Value: a runtime plegd does not know.
            ("runtime = \"docker\"", "line 1, column 11"),
        ];
        for (text, at) in cases {
            let mut file = tempfile::NamedTempFile::new().unwrap();
            writeln!(file, "{text}").unwrap();
            let err = Config::load(&RunArgs {
                config: Some(file.path().to_owned()),
                ..RunArgs::default()
            })
            .unwrap_err();
            assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
            let err = err.to_string();
            assert!(err.contains(at), "{text:?}: {err}");
        }
    }
}
