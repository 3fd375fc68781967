//! The kernel's strings as the probes copy them: fixed-size, NUL-terminated buffers.

/// A NUL-terminated kernel string.
pub(super) fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}
