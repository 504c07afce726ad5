//! Durability of acknowledged writes: the helper answers a mutating file operation only after
//! the written content and the directory entries it created, renamed or removed are on stable
//! storage (`fsync` of the file, then of every directory whose entries changed).
//!
//! A crash of the node after the answer then loses nothing the client was told succeeded.
//! `file.replace` writes in place, so only the file is synced (its directory entry is unchanged).

use std::path::{Path, PathBuf};

use cap_std::fs::{File, OpenOptions, OpenOptionsExt as _};

use super::error::HelperError;
use super::workspace::Workspace;

/// Flushes the content and metadata of a written file.
pub fn sync_file(file: &File, relative: &Path) -> Result<(), HelperError> {
    file.sync_all()?;
    record(format!("file {}", relative.display()));
    Ok(())
}

/// Flushes the entries of the root-relative directory `relative` (`.` for the root).
pub fn sync_directory(ws: &Workspace, relative: &Path) -> Result<(), HelperError> {
    // A directory handle from `open_dir` may be an `O_PATH` descriptor, which cannot be
    // synced: open the directory itself for reading.
    let mut options = OpenOptions::new();
    options
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECTORY.bits() as i32);
    let dir = ws.dir().open_with(relative, &options)?;
    dir.sync_all()?;
    record(format!("dir {}", relative.display()));
    Ok(())
}

/// Flushes the directories a new entry at `relative` changed: its parent, and, when
/// `created_parents` directories were created for it, each of those directories' parents too.
pub fn sync_new_entry(
    ws: &Workspace,
    relative: &Path,
    created_parents: usize,
) -> Result<(), HelperError> {
    let mut directory = parent_of(relative);
    for _ in 0..=created_parents {
        sync_directory(ws, &directory)?;
        if directory == Path::new(".") {
            break;
        }
        directory = parent_of(&directory);
    }
    Ok(())
}

/// The root-relative parent directory of a root-relative path (`.` for a top-level entry).
pub fn parent_of(relative: &Path) -> PathBuf {
    match relative.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
thread_local! {
    static SYNCED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
fn record(what: String) {
    SYNCED.with(|synced| synced.borrow_mut().push(what));
}

#[cfg(not(test))]
fn record(_what: String) {}

/// What this thread synced since the last call, in order (unit tests only).
#[cfg(test)]
pub fn take_synced() -> Vec<String> {
    SYNCED.with(|synced| std::mem::take(&mut *synced.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_entry_syncs_its_parent_and_the_parents_of_created_directories() {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        std::fs::create_dir_all(ws.root().join("a/b/c")).unwrap();
        take_synced();
        sync_new_entry(&ws, Path::new("a/b/c/f"), 2).unwrap();
        assert_eq!(take_synced(), ["dir a/b/c", "dir a/b", "dir a"]);
        sync_new_entry(&ws, Path::new("f"), 0).unwrap();
        assert_eq!(take_synced(), ["dir ."]);
        sync_new_entry(&ws, Path::new("a/f"), 5).unwrap();
        assert_eq!(take_synced(), ["dir a", "dir ."]);
    }
}
