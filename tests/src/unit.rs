//! deploy/systemd/plegd.service as the tests read it: the bounds they hold plegd to are the
//! unit's, never restated.

use anyhow::{Context as _, bail};

/// The unit, as built into the harness.
const UNIT: &str = include_str!("../../deploy/systemd/plegd.service");

/// The unit's `MemoryMax=`, in bytes.
pub fn memory_max() -> anyhow::Result<u64> {
    let value = UNIT
        .lines()
        .find_map(|line| line.strip_prefix("MemoryMax="))
        .context("no MemoryMax= in deploy/systemd/plegd.service")?;
    parse_size(value)
}

/// A memory size as systemd writes it: digits with an optional K, M or G (powers of 1024).
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((at, 'K')) => (&text[..at], 10),
        Some((at, 'M')) => (&text[..at], 20),
        Some((at, 'G')) => (&text[..at], 30),
        _ => (text, 0),
    };
    match digits.parse::<u64>() {
        Ok(number) => Ok(number << shift),
        Err(e) => bail!("memory size {text:?}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_systemd_writes_them() {
        assert_eq!(parse_size("160M").unwrap(), 160 << 20);
        assert_eq!(parse_size(" 2G ").unwrap(), 2 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("10T").is_err());
        assert!(memory_max().unwrap() > 0);
    }
}
