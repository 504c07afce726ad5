//! The confined workspace: a directory handle that no path, `..` or symlink can leave, and the
//! path rules of k8s-executor §4.3.
//!
//! Every file access goes through a `cap_std::fs::Dir` opened on the canonical root, which
//! refuses absolute paths, `..` above the root and any symlink (at any component, leaf
//! included) that leads outside, and follows symlinks that stay inside (absolute symlinks count
//! as leaving, as with Go's `os.Root`). Request paths are first lexically cleaned; absolute
//! request paths are canonicalised against the real file system and reduced to root-relative
//! form.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt as _};

use super::error::HelperError;

/// Mode of directories the helper creates.
pub const DIR_MODE: u32 = 0o755;
/// Mode of files the helper creates.
pub const FILE_MODE: u32 = 0o644;

/// The workspace root and its confined handle.
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    dir: Dir,
}

impl Workspace {
    /// Opens (creating it with mode 0755 if missing) the workspace at `root`. The root is made
    /// absolute and symlink-resolved first.
    pub fn open(root: &Path) -> io::Result<Self> {
        let absolute = if root.is_absolute() {
            root.to_path_buf()
        } else {
            std::env::current_dir()?.join(root)
        };
        std::os::unix::fs::DirBuilderExt::mode(
            std::fs::DirBuilder::new().recursive(true),
            DIR_MODE,
        )
        .create(&absolute)?;
        let root = std::fs::canonicalize(&absolute)?;
        let dir = Dir::open_ambient_dir(&root, ambient_authority())?;
        Ok(Self { root, dir })
    }

    /// The canonical absolute root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The confined handle; every path given to it is root-relative.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Resolves a request path to its cleaned root-relative form (`.` for the root).
    ///
    /// Empty means the root. A relative path is cleaned lexically and must not climb above the
    /// root. An absolute path is canonicalised (symlinks of its deepest existing ancestor
    /// resolved, the missing tail re-appended) and must be the root or under it.
    pub fn resolve(&self, raw: &str) -> Result<PathBuf, HelperError> {
        if raw.contains('\0') {
            return Err(HelperError::InvalidArgument(
                "path contains a NUL byte".to_owned(),
            ));
        }
        let path = Path::new(raw);
        if !path.has_root() {
            return clean_relative(path).ok_or(HelperError::OutsideWorkspace);
        }
        let cleaned = clean_absolute(path);
        let canonical = canonicalize_existing_prefix(&cleaned)?;
        self.relative_of(&canonical)
    }

    /// The canonical absolute form of a root-relative path, which must stay inside the root.
    pub fn canonical(&self, relative: &Path) -> Result<PathBuf, HelperError> {
        let canonical = canonicalize_existing_prefix(&self.root.join(relative))?;
        self.relative_of(&canonical)?;
        Ok(canonical)
    }

    /// Creates the missing parent directories of `relative` (mode 0755) and returns how many
    /// it created. Existing parents are checked through the confined handle, so a parent
    /// symlink leaving the root is refused.
    pub fn create_parents(&self, relative: &Path) -> Result<usize, HelperError> {
        let Some(parent) = relative.parent().filter(|p| !p.as_os_str().is_empty()) else {
            return Ok(0);
        };
        match self.dir.metadata(parent) {
            Ok(meta) if meta.is_dir() => Ok(0),
            Ok(_) => Err(HelperError::internal("a parent is not a directory")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let missing = self.missing_ancestors(parent);
                let mut builder = DirBuilder::new();
                builder.recursive(true).mode(DIR_MODE);
                self.dir.create_dir_with(parent, &builder)?;
                Ok(missing)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// How many of `relative` and its ancestors do not exist yet (`relative` is missing).
    fn missing_ancestors(&self, relative: &Path) -> usize {
        let mut missing = 1;
        let mut current = relative.parent();
        while let Some(ancestor) = current.filter(|a| !a.as_os_str().is_empty()) {
            if self.dir.symlink_metadata(ancestor).is_ok() {
                break;
            }
            missing += 1;
            current = ancestor.parent();
        }
        missing
    }

    fn relative_of(&self, canonical: &Path) -> Result<PathBuf, HelperError> {
        let relative = canonical
            .strip_prefix(&self.root)
            .map_err(|_| HelperError::OutsideWorkspace)?;
        if relative.as_os_str().is_empty() {
            Ok(PathBuf::from("."))
        } else {
            Ok(relative.to_path_buf())
        }
    }
}

/// The base name reported for a root-relative path (`.` for the root).
pub fn base_name(relative: &Path) -> String {
    relative.file_name().map_or_else(
        || ".".to_owned(),
        |name| name.to_string_lossy().into_owned(),
    )
}

/// Lexically cleans a relative path (`.` and empty components dropped, `..` applied); `None`
/// if it climbs above its start. The result is `.` when nothing is left.
pub fn clean_relative(path: &Path) -> Option<PathBuf> {
    let mut parts: Vec<OsString> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part.to_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    if parts.is_empty() {
        return Some(PathBuf::from("."));
    }
    Some(parts.iter().collect())
}

/// Lexically cleans an absolute path; `..` at `/` stays at `/`.
fn clean_absolute(path: &Path) -> PathBuf {
    let mut cleaned = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(part) => cleaned.push(part),
            Component::ParentDir => {
                cleaned.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    cleaned
}

/// Canonicalises the deepest existing ancestor of an absolute path and re-appends the missing
/// tail. Anything that exists but cannot be resolved (a dangling symlink, a permission error,
/// a file used as a directory) counts as an escape: it cannot be verified.
fn canonicalize_existing_prefix(path: &Path) -> Result<PathBuf, HelperError> {
    let mut current = path.to_path_buf();
    let mut tail: Vec<OsString> = Vec::new();
    loop {
        match std::fs::canonicalize(&current) {
            Ok(mut resolved) => {
                resolved.extend(tail.iter().rev());
                return Ok(resolved);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let missing = matches!(
                    std::fs::symlink_metadata(&current),
                    Err(ref e) if e.kind() == io::ErrorKind::NotFound
                );
                let Some(name) = current.file_name().filter(|_| missing) else {
                    return Err(HelperError::OutsideWorkspace);
                };
                tail.push(name.to_owned());
                current.pop();
            }
            Err(_) => return Err(HelperError::OutsideWorkspace),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_cleaned_and_may_not_climb_out() {
        let clean =
            |p: &str| clean_relative(Path::new(p)).map(|p| p.to_string_lossy().into_owned());
        assert_eq!(clean("").as_deref(), Some("."));
        assert_eq!(clean("./a//b/").as_deref(), Some("a/b"));
        assert_eq!(clean("a/../b").as_deref(), Some("b"));
        assert_eq!(clean("a/..").as_deref(), Some("."));
        assert_eq!(clean("../x"), None);
        assert_eq!(clean("a/../../x"), None);
    }

    #[test]
    fn absolute_paths_resolve_inside_the_root_only() {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(&temp.path().join("ws")).unwrap();
        std::fs::create_dir(ws.root().join("d")).unwrap();
        let inside = format!("{}/d/new.txt", ws.root().display());
        assert_eq!(ws.resolve(&inside).unwrap(), PathBuf::from("d/new.txt"));
        assert_eq!(
            ws.resolve(&ws.root().display().to_string()).unwrap(),
            PathBuf::from(".")
        );
        let climbing = format!("{}/../other", ws.root().display());
        assert!(matches!(
            ws.resolve(&climbing),
            Err(HelperError::OutsideWorkspace)
        ));
        assert!(matches!(
            ws.resolve("/etc/passwd"),
            Err(HelperError::OutsideWorkspace)
        ));
        std::os::unix::fs::symlink("/etc", ws.root().join("out")).unwrap();
        let via_link = format!("{}/out/passwd", ws.root().display());
        assert!(matches!(
            ws.resolve(&via_link),
            Err(HelperError::OutsideWorkspace)
        ));
        std::os::unix::fs::symlink("/nonexistent-target", ws.root().join("dangling")).unwrap();
        let dangling = format!("{}/dangling", ws.root().display());
        assert!(matches!(
            ws.resolve(&dangling),
            Err(HelperError::OutsideWorkspace)
        ));
    }

    #[test]
    fn canonical_targets_must_stay_inside() {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(&temp.path().join("ws")).unwrap();
        std::fs::create_dir(ws.root().join("real")).unwrap();
        std::os::unix::fs::symlink("real", ws.root().join("alias")).unwrap();
        std::os::unix::fs::symlink("/", ws.root().join("slash")).unwrap();
        assert_eq!(
            ws.canonical(Path::new("alias/f.txt")).unwrap(),
            ws.root().join("real/f.txt")
        );
        assert!(matches!(
            ws.canonical(Path::new("slash")),
            Err(HelperError::OutsideWorkspace)
        ));
    }
}
