//! `file.glob` and `file.grep` (k8s-executor §4.3): a bounded walk through the confined
//! workspace that never follows a symlinked directory, doublestar matching ([`super::glob`]) and
//! a linear-time regex search (the `regex` crate: RE2 syntax, no backtracking).
//!
//! Bounds, beyond the result `limit`: the walk visits at most [`MAX_WALK_ENTRIES`] entries,
//! grep reads only files up to `MaxFileBytes` (larger ones are skipped like unreadable ones) and
//! at most [`MAX_GREP_SCAN_BYTES`] in total, and the encoded paths and texts of one response stay
//! under [`MAX_RESULT_BYTES`], so the envelope always fits the 8 MiB stdout frame. Passing a
//! bound gives `resource_exhausted`.

use std::io::{self, Read as _};
use std::path::{Path, PathBuf};

use cap_std::fs::Dir;

use super::error::HelperError;
use super::files::{Access, open_regular};
use super::glob::GlobPattern;
use super::workspace::Workspace;
use crate::executor::protocol::{ExecutorResponse, GrepMatch, MAX_FILE_BYTES};

/// Most directory entries one walk visits.
pub const MAX_WALK_ENTRIES: usize = 100_000;
/// Most file bytes one grep reads in total (256 MiB).
pub const MAX_GREP_SCAN_BYTES: u64 = 256 * 1024 * 1024;
/// Most JSON-encoded bytes of paths and texts in one response (6 MiB).
pub const MAX_RESULT_BYTES: usize = 6 * 1024 * 1024;
/// Largest compiled regex program.
pub const MAX_REGEX_PROGRAM: usize = 4 * 1024 * 1024;

const TOO_MANY_RESULTS: &str = "result exceeds configured limit";
const WALK_TOO_LARGE: &str = "workspace walk exceeds configured limit";

/// What kind of entry the walk found (symlinks are never reported).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Other,
}

/// One matched entry: its root-relative slash path and kind.
struct Found {
    path: String,
    kind: Kind,
}

/// `file.glob`: every entry (file or directory, never a symlink, never the root) whose
/// root-relative path matches `pattern`, sorted.
pub fn glob(ws: &Workspace, pattern: &str, limit: usize) -> Result<ExecutorResponse, HelperError> {
    let pattern = GlobPattern::new(pattern).map_err(|e| HelperError::internal(e.to_string()))?;
    let found = walk(ws.dir(), &pattern, limit)?;
    let mut budget = ResultBudget::default();
    let mut paths = Vec::with_capacity(found.len());
    for entry in found {
        budget.spend(&entry.path)?;
        paths.push(entry.path);
    }
    Ok(ExecutorResponse {
        paths,
        ..ExecutorResponse::default()
    })
}

/// `file.grep`: lines matching the regex `pattern` in the regular files chosen by the glob
/// `files` (every regular file when empty). Files with a NUL byte, unreadable files and files
/// over `MaxFileBytes` are skipped.
pub fn grep(
    ws: &Workspace,
    pattern: &str,
    files: &str,
    limit: usize,
) -> Result<ExecutorResponse, HelperError> {
    let regex = regex::RegexBuilder::new(pattern)
        .size_limit(MAX_REGEX_PROGRAM)
        .dfa_size_limit(MAX_REGEX_PROGRAM)
        .build()
        .map_err(|e| HelperError::internal(e.to_string()))?;
    let chooser = if files.is_empty() { "**" } else { files };
    let chooser = GlobPattern::new(chooser).map_err(|e| HelperError::internal(e.to_string()))?;
    // The walk itself is bounded by entries, not by the match limit.
    let candidates = walk(ws.dir(), &chooser, MAX_WALK_ENTRIES)?;
    let mut matches = Vec::new();
    let mut budget = ResultBudget::default();
    let mut scanned = 0u64;
    for file in candidates.into_iter().filter(|f| f.kind == Kind::File) {
        let Some(content) = read_searchable(ws, &file.path, &mut scanned)? else {
            continue;
        };
        let text = String::from_utf8_lossy(&content);
        let body = text.strip_suffix('\n').unwrap_or(&text);
        for (index, line) in body.split('\n').enumerate() {
            if !regex.is_match(line) {
                continue;
            }
            if matches.len() == limit {
                return Err(HelperError::ResourceExhausted(TOO_MANY_RESULTS));
            }
            budget.spend(&file.path)?;
            budget.spend(line)?;
            matches.push(GrepMatch {
                path: file.path.clone(),
                line: i64::try_from(index + 1).unwrap_or(i64::MAX),
                text: line.to_owned(),
            });
        }
    }
    Ok(ExecutorResponse {
        matches,
        ..ExecutorResponse::default()
    })
}

/// The content of a file worth searching, or `None` to skip it (unreadable, a symlink or not
/// a regular file by now, hard-linked, over `MaxFileBytes`, or containing a NUL byte).
fn read_searchable(
    ws: &Workspace,
    path: &str,
    scanned: &mut u64,
) -> Result<Option<Vec<u8>>, HelperError> {
    let Ok(meta) = ws.dir().symlink_metadata(path) else {
        return Ok(None);
    };
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES as u64 {
        return Ok(None);
    }
    *scanned += meta.len();
    if *scanned > MAX_GREP_SCAN_BYTES {
        return Err(HelperError::ResourceExhausted(WALK_TOO_LARGE));
    }
    let Ok(file) = open_regular(ws, Path::new(path), Access::Read) else {
        return Ok(None);
    };
    let mut content = Vec::new();
    if file
        .take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut content)
        .is_err()
        || content.len() > MAX_FILE_BYTES
        || content.contains(&0)
    {
        return Ok(None);
    }
    Ok(Some(content))
}

/// A directory entry's name and kind (`None` for a symlink).
type Entry = (String, Option<Kind>);

/// Counts the JSON-encoded size of the strings going into a response.
#[derive(Default)]
struct ResultBudget {
    spent: usize,
}

impl ResultBudget {
    fn spend(&mut self, text: &str) -> Result<(), HelperError> {
        let encoded = serde_json::to_string(text).map_or(usize::MAX, |s| s.len());
        self.spent = self.spent.saturating_add(encoded);
        if self.spent > MAX_RESULT_BYTES {
            return Err(HelperError::ResourceExhausted(TOO_MANY_RESULTS));
        }
        Ok(())
    }
}

/// Walks the confined tree from the root, descending only into real (non-symlink)
/// directories that could hold a match, and returns the matching entries sorted by path.
/// More than `limit` matches, or more than [`MAX_WALK_ENTRIES`] entries visited, is
/// `resource_exhausted`.
fn walk(root: &Dir, pattern: &GlobPattern, limit: usize) -> Result<Vec<Found>, HelperError> {
    let mut found = Vec::new();
    let mut visited = 0usize;
    let mut pending: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(dir_segments) = pending.pop() {
        let refs: Vec<&str> = dir_segments.iter().map(String::as_str).collect();
        if !pattern.may_match_below(&refs) {
            continue;
        }
        let Some(entries) = read_dir(root, &dir_segments)? else {
            continue;
        };
        for (name, kind) in entries {
            visited += 1;
            if visited > MAX_WALK_ENTRIES {
                return Err(HelperError::ResourceExhausted(WALK_TOO_LARGE));
            }
            let mut segments = dir_segments.clone();
            segments.push(name);
            let refs: Vec<&str> = segments.iter().map(String::as_str).collect();
            if kind.is_some() && pattern.matches(&refs) {
                if found.len() == limit {
                    return Err(HelperError::ResourceExhausted(TOO_MANY_RESULTS));
                }
                found.push(Found {
                    path: segments.join("/"),
                    kind: kind.unwrap_or(Kind::Other),
                });
            }
            if kind == Some(Kind::Dir) {
                pending.push(segments);
            }
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// The entries of one directory with their kinds (`None` for a symlink, which is neither
/// reported nor followed). A directory that vanished or cannot be read is skipped.
fn read_dir(root: &Dir, segments: &[String]) -> Result<Option<Vec<Entry>>, HelperError> {
    let relative: PathBuf = if segments.is_empty() {
        PathBuf::from(".")
    } else {
        segments.iter().collect()
    };
    let dir = match open_real_dir(root, &relative) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error().is_some() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut entries = Vec::new();
    for entry in dir.entries()? {
        let Ok(entry) = entry else { continue };
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        let kind = if file_type.is_symlink() {
            None
        } else if file_type.is_dir() {
            Some(Kind::Dir)
        } else if file_type.is_file() {
            Some(Kind::File)
        } else {
            Some(Kind::Other)
        };
        entries.push((entry.file_name().to_string_lossy().into_owned(), kind));
    }
    Ok(Some(entries))
}

/// Opens a directory found by the walk, refusing it if it was swapped for a symlink since
/// it was listed (the confined handle keeps even that inside the root).
fn open_real_dir(root: &Dir, relative: &Path) -> io::Result<Dir> {
    if relative != Path::new(".") && root.symlink_metadata(relative)?.is_symlink() {
        return Err(io::Error::from(io::ErrorKind::NotFound));
    }
    root.open_dir(relative)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        (temp, ws)
    }

    #[test]
    fn a_grep_reads_256_mib_in_all_and_refuses_one_byte_more() {
        let (_temp, ws) = workspace();
        // Sparse files (holes read as NUL bytes, so they are counted and then skipped): 51 of
        // MaxFileBytes and one of 1 MiB make exactly 256 MiB.
        let sparse = |name: &str, len: u64| {
            let file = std::fs::File::create(ws.root().join(name)).unwrap();
            file.set_len(len).unwrap();
        };
        for i in 0..51 {
            sparse(&format!("f{i:02}"), MAX_FILE_BYTES as u64);
        }
        sparse("g", 1 << 20);
        assert!(grep(&ws, "x", "", 10).unwrap().matches.is_empty());
        std::fs::write(ws.root().join("h"), b"x").unwrap();
        assert!(matches!(
            grep(&ws, "x", "", 10),
            Err(HelperError::ResourceExhausted(WALK_TOO_LARGE))
        ));
    }

    #[test]
    fn a_result_of_6_mib_is_answered_and_one_byte_more_refused() {
        let (_temp, ws) = workspace();
        // Each match costs its JSON-encoded path (`"a"`: 3 bytes) and line (a line of 1,000
        // letters: 1,002 bytes). 6,260 such matches and one whose line has 151 letters make
        // exactly 6 MiB (6,291,456 bytes).
        let lines = |n: usize| format!("{}\n", "a".repeat(1000)).repeat(n);
        std::fs::write(ws.root().join("a"), lines(3000)).unwrap();
        std::fs::write(ws.root().join("b"), lines(3000)).unwrap();
        let last = |letters: usize| format!("{}{}\n", lines(260), "a".repeat(letters));
        std::fs::write(ws.root().join("c"), last(151)).unwrap();
        assert_eq!(grep(&ws, "a", "", 10_000).unwrap().matches.len(), 6261);
        std::fs::write(ws.root().join("c"), last(152)).unwrap();
        assert!(matches!(
            grep(&ws, "a", "", 10_000),
            Err(HelperError::ResourceExhausted(TOO_MANY_RESULTS))
        ));
    }

    #[test]
    fn a_regex_program_of_up_to_4_mib_compiles_and_a_larger_one_is_refused() {
        let (_temp, ws) = workspace();
        std::fs::write(ws.root().join("f"), "w".repeat(60)).unwrap();
        // Unicode `\w` repeated 50 times compiles to between 1 and 4 MiB; 100 times to more.
        assert_eq!(grep(&ws, r"\w{50}", "", 10).unwrap().matches.len(), 1);
        assert!(matches!(
            grep(&ws, r"\w{100}", "", 10),
            Err(HelperError::Internal(_))
        ));
    }
}
