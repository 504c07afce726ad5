//! The confined file operations of k8s-executor §4.3.

use std::io::{self, Read, Seek as _, SeekFrom, Write};
use std::path::{Path, PathBuf};

use cap_std::fs::{File, Metadata, MetadataExt as _, OpenOptions, OpenOptionsExt as _};
use sha2::Digest as _;

use super::durable;
use super::error::HelperError;
use super::workspace::{FILE_MODE, Workspace, base_name};
use crate::executor::protocol::{
    ExecutorResponse, FileInfo, MAX_FILE_BYTES, MODE_CHAR_DEVICE, MODE_DEVICE, MODE_DIR,
    MODE_IRREGULAR, MODE_NAMED_PIPE, MODE_PERM, MODE_SETGID, MODE_SETUID, MODE_SOCKET, MODE_STICKY,
    MODE_SYMLINK, content_version, format_rfc3339_nano,
};

/// Files larger than this are refused outright by `file.read` (an internal error).
pub const MAX_READABLE_FILE: u64 = 64 * 1024 * 1024;

const FILE_TOO_LARGE: &str = "file exceeds configured limit";
const DIRECTORY_TOO_LARGE: &str = "directory exceeds configured limit";

/// How [`open_regular`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Read and write, without truncating.
    ReadWrite,
}

/// Opens an existing regular file whose content may be read or written: the open never blocks
/// (`O_NONBLOCK`, so a FIFO or device swapped in cannot hang the helper) and the opened handle,
/// not the path, is checked. Anything but a regular file is internal; a file with more than one
/// hard link is refused as outside the workspace, since another name for the same content may
/// live outside it (writing or reading through the alias would reach it).
pub fn open_regular(ws: &Workspace, path: &Path, access: Access) -> Result<File, HelperError> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .write(access == Access::ReadWrite)
        .custom_flags(libc_flags::NONBLOCK | libc_flags::NOCTTY);
    let file = ws.dir().open_with(path, &options)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(HelperError::internal("not a regular file"));
    }
    if meta.nlink() > 1 {
        return Err(HelperError::OutsideWorkspace);
    }
    Ok(file)
}

/// The open flags [`open_regular`] adds, from rustix (no libc dependency).
mod libc_flags {
    pub const NONBLOCK: i32 = rustix::fs::OFlags::NONBLOCK.bits() as i32;
    pub const NOCTTY: i32 = rustix::fs::OFlags::NOCTTY.bits() as i32;
}

/// `file.read`: the whole content (at most 5 MiB) and its version.
pub fn read(ws: &Workspace, path: &Path) -> Result<ExecutorResponse, HelperError> {
    let file = open_regular(ws, path, Access::Read)?;
    if file.metadata()?.len() > MAX_READABLE_FILE {
        return Err(HelperError::internal("file too large to read"));
    }
    let mut data = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut data)?;
    if data.len() > MAX_FILE_BYTES {
        return Err(HelperError::ResourceExhausted(FILE_TOO_LARGE));
    }
    Ok(ExecutorResponse {
        version: content_version(&data),
        data,
        ..ExecutorResponse::default()
    })
}

/// `file.stat`: metadata, following symlinks that stay inside the root.
pub fn stat(ws: &Workspace, path: &Path) -> Result<ExecutorResponse, HelperError> {
    let meta = ws.dir().metadata(path)?;
    Ok(ExecutorResponse {
        info: Some(file_info(base_name(path), &meta)),
        ..ExecutorResponse::default()
    })
}

/// `file.create`: exclusive create (0644) after creating missing parents (0755); the file and
/// the directories whose entries changed are synced before the answer.
pub fn create(ws: &Workspace, path: &Path, data: &[u8]) -> Result<ExecutorResponse, HelperError> {
    let created_parents = ws.create_parents(path)?;
    write_new(ws, path, data, created_parents)?;
    Ok(version_response(content_version(data)))
}

/// Creates `path` exclusively with `data` and makes it durable.
fn write_new(
    ws: &Workspace,
    path: &Path,
    data: &[u8],
    created_parents: usize,
) -> Result<(), HelperError> {
    let mut file = ws.dir().open_with(
        path,
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE),
    )?;
    file.write_all(data)?;
    durable::sync_file(&file, path)?;
    durable::sync_new_entry(ws, path, created_parents)
}

/// `file.replace`: compare-and-swap on the SHA-256 version, then an in-place truncating write.
///
/// The check and the write happen on one open handle under an exclusive `flock`, so of two
/// helpers replacing the same file with the same expected version exactly one wins (the other
/// sees the new content and answers `version_mismatch`). Writers that do not lock (the
/// workload's own commands) can still race it, as the spec says.
pub fn replace(
    ws: &Workspace,
    path: &Path,
    data: &[u8],
    expected_version: &str,
) -> Result<ExecutorResponse, HelperError> {
    let mut file = open_regular(ws, path, Access::ReadWrite)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| HelperError::internal(e.to_string()))?;
    let current = hash_reader(&mut file)?;
    if expected_version.is_empty() || current != expected_version {
        return Err(HelperError::VersionMismatch);
    }
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(data)?;
    durable::sync_file(&file, path)?;
    Ok(version_response(content_version(data)))
}

/// `file.list`: the immediate children, sorted by name, not followed.
pub fn list(ws: &Workspace, path: &Path, limit: usize) -> Result<ExecutorResponse, HelperError> {
    let dir = ws.dir().open_dir(path)?;
    let mut names = Vec::new();
    for entry in dir.entries()? {
        names.push(entry?.file_name());
        if names.len() > limit {
            return Err(HelperError::ResourceExhausted(DIRECTORY_TOO_LARGE));
        }
    }
    names.sort();
    Ok(ExecutorResponse {
        entries: listed_entries(&dir, names)?,
        ..ExecutorResponse::default()
    })
}

/// The metadata of each listed name, not followed; a name removed since the listing is left
/// out.
fn listed_entries(
    dir: &cap_std::fs::Dir,
    names: Vec<std::ffi::OsString>,
) -> Result<Vec<FileInfo>, HelperError> {
    let mut entries = Vec::with_capacity(names.len());
    for name in names {
        match dir.symlink_metadata(&name) {
            Ok(meta) => entries.push(file_info(name.to_string_lossy().into_owned(), &meta)),
            // Removed between the listing and the lstat.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(entries)
}

/// `file.remove`: one file, link or empty directory; never recursive.
pub fn remove(ws: &Workspace, path: &Path) -> Result<ExecutorResponse, HelperError> {
    if path == Path::new(".") {
        return Err(HelperError::internal("cannot remove the workspace root"));
    }
    ws.canonical(path)?;
    let meta = ws.dir().symlink_metadata(path)?;
    if meta.is_dir() {
        ws.dir().remove_dir(path)?;
    } else {
        ws.dir().remove_file(path)?;
    }
    durable::sync_directory(ws, &durable::parent_of(path))?;
    Ok(ExecutorResponse::default())
}

/// `file.rename`: never clobbers; destination parents are created.
///
/// The kernel refuses an existing destination atomically (`RENAME_NOREPLACE`), so a writer
/// creating the destination concurrently is never overwritten. Both names are resolved through
/// the confined handle: the rename acts on their parent directories, each opened confined.
/// A file system without `RENAME_NOREPLACE` gets an internal error, never a clobbering rename.
pub fn rename(
    ws: &Workspace,
    source: &Path,
    destination: &Path,
) -> Result<ExecutorResponse, HelperError> {
    if source == Path::new(".") || destination == Path::new(".") {
        return Err(HelperError::internal("cannot rename the workspace root"));
    }
    ws.dir().symlink_metadata(source)?;
    let created_parents = ws.create_parents(destination)?;
    let (source_dir, source_name) = (durable::parent_of(source), entry_name(source)?);
    let (target_dir, target_name) = (durable::parent_of(destination), entry_name(destination)?);
    let from = ws.dir().open_dir(&source_dir)?;
    let to = ws.dir().open_dir(&target_dir)?;
    rustix::fs::renameat_with(
        &from,
        source_name,
        &to,
        target_name,
        rustix::fs::RenameFlags::NOREPLACE,
    )
    .map_err(io::Error::from)?;
    durable::sync_directory(ws, &source_dir)?;
    if target_dir != source_dir {
        durable::sync_new_entry(ws, destination, created_parents)?;
    }
    Ok(ExecutorResponse::default())
}

/// The last component of a cleaned root-relative path.
fn entry_name(relative: &Path) -> Result<&std::ffi::OsStr, HelperError> {
    relative
        .file_name()
        .ok_or_else(|| HelperError::internal("a path without a final name"))
}

/// `file.copy`: a regular file, bounded like a write ([`MAX_FILE_BYTES`]), to a new,
/// exclusively created destination, made durable like `file.create`.
pub fn copy(
    ws: &Workspace,
    source: &Path,
    destination: &Path,
) -> Result<ExecutorResponse, HelperError> {
    let input = open_regular(ws, source, Access::Read)?;
    if input.metadata()?.len() > MAX_FILE_BYTES as u64 {
        return Err(HelperError::ResourceExhausted(FILE_TOO_LARGE));
    }
    let mut data = Vec::new();
    input
        .take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut data)?;
    if data.len() > MAX_FILE_BYTES {
        return Err(HelperError::ResourceExhausted(FILE_TOO_LARGE));
    }
    refuse_existing(ws, destination)?;
    let created_parents = ws.create_parents(destination)?;
    write_new(ws, destination, &data, created_parents)?;
    Ok(version_response(content_version(&data)))
}

/// `file.resolve_authority`: the canonical target and the canonical root.
pub fn resolve_authority(ws: &Workspace, path: &Path) -> Result<ExecutorResponse, HelperError> {
    let target: PathBuf = ws.canonical(path)?;
    Ok(ExecutorResponse {
        authority_target: target.to_string_lossy().into_owned(),
        authority_workspace: ws.root().to_string_lossy().into_owned(),
        ..ExecutorResponse::default()
    })
}

/// Metadata in the wire form, with Go `fs.FileMode` bits.
pub fn file_info(name: String, meta: &Metadata) -> FileInfo {
    let nanos = u32::try_from(meta.mtime_nsec()).unwrap_or(0);
    FileInfo {
        name,
        size: i64::try_from(meta.len()).unwrap_or(i64::MAX),
        mode: go_file_mode(meta.mode()),
        mod_time: format_rfc3339_nano(meta.mtime(), nanos),
        is_dir: meta.is_dir(),
    }
}

/// Converts a Unix `st_mode` to Go `fs.FileMode` bits.
pub fn go_file_mode(st_mode: u32) -> u32 {
    const S_IFMT: u32 = 0o170_000;
    let mut mode = st_mode & MODE_PERM;
    mode |= match st_mode & S_IFMT {
        0o040_000 => MODE_DIR,
        0o120_000 => MODE_SYMLINK,
        0o010_000 => MODE_NAMED_PIPE,
        0o140_000 => MODE_SOCKET,
        0o020_000 => MODE_DEVICE | MODE_CHAR_DEVICE,
        0o060_000 => MODE_DEVICE,
        0o100_000 => 0,
        _ => MODE_IRREGULAR,
    };
    if st_mode & 0o4000 != 0 {
        mode |= MODE_SETUID;
    }
    if st_mode & 0o2000 != 0 {
        mode |= MODE_SETGID;
    }
    if st_mode & 0o1000 != 0 {
        mode |= MODE_STICKY;
    }
    mode
}

fn refuse_existing(ws: &Workspace, path: &Path) -> Result<(), HelperError> {
    match ws.dir().symlink_metadata(path) {
        Ok(_) => Err(HelperError::AlreadyExists),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn hash_reader(file: &mut impl Read) -> Result<String, HelperError> {
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => return Ok(hex::encode(hasher.finalize())),
            Ok(n) => hasher.update(&buffer[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

fn version_response(version: String) -> ExecutorResponse {
    ExecutorResponse {
        version,
        ..ExecutorResponse::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_modes_become_go_file_modes() {
        assert_eq!(go_file_mode(0o100_644), 0o644);
        assert_eq!(go_file_mode(0o040_755), MODE_DIR | 0o755);
        assert_eq!(go_file_mode(0o120_777), MODE_SYMLINK | 0o777);
        assert_eq!(go_file_mode(0o041_777), MODE_DIR | MODE_STICKY | 0o777);
        assert_eq!(
            go_file_mode(0o020_666),
            MODE_DEVICE | MODE_CHAR_DEVICE | 0o666
        );
        assert_eq!(go_file_mode(0o104_755), MODE_SETUID | 0o755);
    }

    /// Each operation answers in its own fields of the response.
    #[test]
    fn each_operation_answers_in_its_own_fields() {
        use crate::helper::search;
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        let created = create(&ws, Path::new("dir/f.txt"), b"hello\n").unwrap();
        let version = content_version(b"hello\n");
        assert_eq!(created.version, version);
        let read_back = read(&ws, Path::new("dir/f.txt")).unwrap();
        assert_eq!(
            (read_back.data.as_slice(), &read_back.version),
            (&b"hello\n"[..], &version)
        );
        let info = stat(&ws, Path::new("dir/f.txt")).unwrap().info.unwrap();
        assert_eq!(
            (info.name.as_str(), info.size, info.is_dir),
            ("f.txt", 6, false)
        );
        let listed = list(&ws, Path::new("dir"), 10).unwrap().entries;
        assert_eq!(
            listed.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["f.txt"]
        );
        let authority = resolve_authority(&ws, Path::new("dir/f.txt")).unwrap();
        let root = ws.root().canonicalize().unwrap();
        assert_eq!(authority.authority_workspace, root.to_string_lossy());
        assert_eq!(
            authority.authority_target,
            root.join("dir/f.txt").to_string_lossy()
        );
        let found = search::glob(&ws, "**/*.txt", 10).unwrap().paths;
        assert_eq!(found, ["dir/f.txt"]);
        let matches = search::grep(&ws, "hel+o", "", 10).unwrap().matches;
        assert_eq!(
            matches
                .iter()
                .map(|m| (m.path.as_str(), m.line))
                .collect::<Vec<_>>(),
            [("dir/f.txt", 1)]
        );
    }

    #[test]
    fn a_name_removed_between_the_listing_and_its_lstat_is_left_out() {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        create(&ws, Path::new("kept"), b"k").unwrap();
        let dir = ws.dir().open_dir(".").unwrap();
        let names = ["gone", "kept"].map(std::ffi::OsString::from).to_vec();
        let entries = listed_entries(&dir, names).unwrap();
        assert_eq!(
            entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["kept"]
        );
    }

    #[test]
    fn a_parent_symlink_leaving_the_root_is_refused_on_create() {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(&temp.path().join("ws")).unwrap();
        std::os::unix::fs::symlink(temp.path(), ws.root().join("up")).unwrap();
        let err = create(&ws, Path::new("up/escaped.txt"), b"x").unwrap_err();
        assert!(matches!(err, HelperError::OutsideWorkspace), "{err:?}");
        assert!(!temp.path().join("escaped.txt").exists());
        let err = create(&ws, Path::new("up/deeper/escaped.txt"), b"x").unwrap_err();
        assert!(matches!(err, HelperError::OutsideWorkspace), "{err:?}");
        assert!(!temp.path().join("deeper").exists());
    }

    #[test]
    fn rename_and_copy_never_clobber() {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        create(&ws, Path::new("a"), b"A").unwrap();
        create(&ws, Path::new("b"), b"B").unwrap();
        assert!(matches!(
            rename(&ws, Path::new("a"), Path::new("b")),
            Err(HelperError::AlreadyExists)
        ));
        assert!(matches!(
            copy(&ws, Path::new("a"), Path::new("b")),
            Err(HelperError::AlreadyExists)
        ));
        let copied = copy(&ws, Path::new("a"), Path::new("sub/c")).unwrap();
        assert_eq!(copied.version, content_version(b"A"));
        rename(&ws, Path::new("a"), Path::new("moved/a")).unwrap();
        assert_eq!(std::fs::read(ws.root().join("moved/a")).unwrap(), b"A");
        assert_eq!(std::fs::read(ws.root().join("b")).unwrap(), b"B");
    }

    #[test]
    fn rename_refuses_every_existing_destination_kind() {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        create(&ws, Path::new("a"), b"A").unwrap();
        std::os::unix::fs::symlink("nowhere", ws.root().join("dangling")).unwrap();
        std::fs::create_dir(ws.root().join("empty")).unwrap();
        for existing in ["dangling", "empty"] {
            assert!(matches!(
                rename(&ws, Path::new("a"), Path::new(existing)),
                Err(HelperError::AlreadyExists)
            ));
        }
        assert_eq!(std::fs::read(ws.root().join("a")).unwrap(), b"A");
        assert!(ws.root().join("empty").is_dir());
    }

    #[test]
    fn a_read_is_bounded_at_the_file_limit_by_the_bytes_it_reads() {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        std::fs::write(ws.root().join("edge"), vec![b'y'; MAX_FILE_BYTES]).unwrap();
        let read_back = read(&ws, Path::new("edge")).unwrap();
        assert_eq!(read_back.data.len(), MAX_FILE_BYTES);
        // One byte over the limit (and under MAX_READABLE_FILE) is refused, not cut short.
        std::fs::write(ws.root().join("over"), vec![b'x'; MAX_FILE_BYTES + 1]).unwrap();
        let err = read(&ws, Path::new("over")).unwrap_err();
        assert!(
            matches!(err, HelperError::ResourceExhausted(FILE_TOO_LARGE)),
            "{err:?}"
        );
        // A file whose size alone is beyond what may be read is refused before reading.
        let huge = std::fs::File::create(ws.root().join("huge")).unwrap();
        huge.set_len(MAX_READABLE_FILE + 1).unwrap();
        assert!(matches!(
            read(&ws, Path::new("huge")),
            Err(HelperError::Internal(_))
        ));
    }

    #[test]
    fn copy_is_bounded_like_a_write() {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        std::fs::write(ws.root().join("big"), vec![b'x'; MAX_FILE_BYTES + 1]).unwrap();
        let err = copy(&ws, Path::new("big"), Path::new("out/big")).unwrap_err();
        assert!(
            matches!(err, HelperError::ResourceExhausted(FILE_TOO_LARGE)),
            "{err:?}"
        );
        assert!(!ws.root().join("out").exists(), "nothing is created");
        std::fs::write(ws.root().join("edge"), vec![b'y'; MAX_FILE_BYTES]).unwrap();
        let copied = copy(&ws, Path::new("edge"), Path::new("edge2")).unwrap();
        assert_eq!(copied.version, content_version(&vec![b'y'; MAX_FILE_BYTES]));
    }

    #[test]
    fn every_acknowledged_write_is_synced_with_the_directories_it_changed() {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        durable::take_synced();
        create(&ws, Path::new("d/e/f"), b"1").unwrap();
        assert_eq!(
            durable::take_synced(),
            ["file d/e/f", "dir d/e", "dir d", "dir ."]
        );
        let version = content_version(b"1");
        replace(&ws, Path::new("d/e/f"), b"2", &version).unwrap();
        assert_eq!(durable::take_synced(), ["file d/e/f"]);
        copy(&ws, Path::new("d/e/f"), Path::new("d/g")).unwrap();
        assert_eq!(durable::take_synced(), ["file d/g", "dir d"]);
        rename(&ws, Path::new("d/g"), Path::new("h/g")).unwrap();
        assert_eq!(durable::take_synced(), ["dir d", "dir h", "dir ."]);
        rename(&ws, Path::new("h/g"), Path::new("h/i")).unwrap();
        assert_eq!(durable::take_synced(), ["dir h"]);
        remove(&ws, Path::new("h/i")).unwrap();
        assert_eq!(durable::take_synced(), ["dir h"]);
    }
}
