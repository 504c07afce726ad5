//! Command output: bounded capture of each stream, and the combined UTF-8 cap of
//! k8s-executor §4.3 (DECISIONS 12: output past the cap is cut and flagged `truncated`).

use tokio::io::{AsyncRead, AsyncReadExt};

/// How many bytes past the output cap each stream is captured, so that a UTF-8 character
/// straddling the cap is repaired correctly before the cut.
pub const CAPTURE_SLACK: usize = 4;

/// What one stream produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first bytes, up to the capture cap.
    pub bytes: Vec<u8>,
    /// True if the stream wrote more than the capture cap (the rest was read and dropped).
    pub overflowed: bool,
    /// True if reading the stream failed.
    pub failed: bool,
}

/// Reads `reader` to EOF, keeping at most `cap` bytes and draining the rest.
pub async fn capture(mut reader: impl AsyncRead + Unpin, cap: usize) -> Captured {
    let mut captured = Captured::default();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) => return captured,
            Ok(n) => {
                let room = cap.saturating_sub(captured.bytes.len());
                captured.bytes.extend_from_slice(&chunk[..n.min(room)]);
                if n > room {
                    captured.overflowed = true;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                captured.failed = true;
                return captured;
            }
        }
    }
}

/// Output as reported: valid UTF-8, at most the cap in total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CappedOutput {
    /// Kept standard output.
    pub stdout: Vec<u8>,
    /// Kept standard error.
    pub stderr: Vec<u8>,
    /// True if anything was dropped.
    pub truncated: bool,
}

/// Repairs both streams to valid UTF-8 (invalid bytes become U+FFFD), keeps stdout up to `cap`
/// bytes and stderr up to what is left, each cut back to a character boundary. `truncated` is
/// set if a writer overflowed its capture or the repaired total exceeds what is kept.
pub fn cap_output(stdout: &[u8], stderr: &[u8], cap: usize, overflowed: bool) -> CappedOutput {
    let stdout = String::from_utf8_lossy(stdout);
    let stderr = String::from_utf8_lossy(stderr);
    let kept_stdout = prefix_at_boundary(&stdout, cap);
    let kept_stderr = prefix_at_boundary(&stderr, cap - kept_stdout.len());
    let truncated =
        overflowed || kept_stdout.len() + kept_stderr.len() < stdout.len() + stderr.len();
    CappedOutput {
        stdout: kept_stdout.as_bytes().to_vec(),
        stderr: kept_stderr.as_bytes().to_vec(),
        truncated,
    }
}

/// The longest prefix of `text` that is at most `limit` bytes and ends on a char boundary.
fn prefix_at_boundary(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_under_the_cap_is_kept_whole() {
        let out = cap_output(b"out", b"err", 10, false);
        assert_eq!(
            out,
            CappedOutput {
                stdout: b"out".to_vec(),
                stderr: b"err".to_vec(),
                truncated: false
            }
        );
    }

    #[test]
    fn stdout_is_kept_first_and_stderr_gets_the_rest() {
        let out = cap_output(b"abcdef", b"ghij", 8, false);
        assert_eq!(out.stdout, b"abcdef");
        assert_eq!(out.stderr, b"gh");
        assert!(out.truncated);
        let out = cap_output(b"abcdefghij", b"xyz", 8, false);
        assert_eq!(out.stdout, b"abcdefgh");
        assert!(out.stderr.is_empty());
    }

    #[test]
    fn invalid_utf8_is_repaired_and_cuts_land_on_char_boundaries() {
        let out = cap_output(b"a\xffb", b"", 100, false);
        assert_eq!(out.stdout, "a\u{fffd}b".as_bytes());
        assert!(!out.truncated);
        let out = cap_output("ééé".as_bytes(), b"", 5, false);
        assert_eq!(out.stdout, "éé".as_bytes());
        assert!(out.truncated);
    }

    #[test]
    fn an_overflowed_writer_is_truncated_even_if_everything_kept_fits() {
        assert!(cap_output(b"abc", b"", 10, true).truncated);
    }

    #[tokio::test]
    async fn capture_keeps_the_cap_and_drains_the_rest() {
        let data = vec![b'x'; 200_000];
        let captured = capture(&data[..], 1000).await;
        assert_eq!(captured.bytes.len(), 1000);
        assert!(captured.overflowed);
        assert!(!captured.failed);
    }
}
