//! The in-memory workspace of one environment: the helper's file contract (confined paths,
//! implicit parent directories, create-never-clobbers, version-checked replace, sorted
//! listings, remove of files and empty directories, rename and copy that never clobber) on a
//! `BTreeMap`, answering with the helper's own errors so the conformance cases apply.
//! Symlinks, permission bits and real modification times are outside this model.

use std::collections::{BTreeMap, BTreeSet};

use execution_provider::executor::protocol::{
    ExecutorResponse, FileInfo, MODE_DIR, content_version,
};
use execution_provider::helper::error::HelperError;

/// The workspace root as this executor reports it.
pub const WORKSPACE_ROOT: &str = "/workspace";
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = MODE_DIR | 0o755;
const MOD_TIME: &str = "2026-01-01T00:00:00Z";

/// A root-relative, normalised path (`""` is the root).
pub type RelPath = String;

/// Resolves a request path lexically inside the workspace.
pub fn resolve(path: &str) -> Result<RelPath, HelperError> {
    let relative = if let Some(rest) = path.strip_prefix(WORKSPACE_ROOT) {
        if !rest.is_empty() && !rest.starts_with('/') {
            return Err(HelperError::OutsideWorkspace);
        }
        rest
    } else if path.starts_with('/') {
        return Err(HelperError::OutsideWorkspace);
    } else {
        path
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop().ok_or(HelperError::OutsideWorkspace)?;
            }
            other => parts.push(other),
        }
    }
    Ok(parts.join("/"))
}

fn parent(path: &str) -> Option<&str> {
    if path.is_empty() {
        None
    } else {
        Some(path.rsplit_once('/').map_or("", |(p, _)| p))
    }
}

fn base(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, b)| b)
}

/// One workspace.
#[derive(Debug, Default, Clone)]
pub struct MemFs {
    files: BTreeMap<RelPath, Vec<u8>>,
    dirs: BTreeSet<RelPath>,
}

impl MemFs {
    fn is_dir(&self, path: &str) -> bool {
        path.is_empty() || self.dirs.contains(path)
    }

    fn exists(&self, path: &str) -> bool {
        self.is_dir(path) || self.files.contains_key(path)
    }

    fn make_parents(&mut self, path: &str) -> Result<(), HelperError> {
        let mut current = parent(path);
        while let Some(dir) = current {
            if self.files.contains_key(dir) {
                return Err(HelperError::internal("a parent is a file"));
            }
            if !dir.is_empty() {
                self.dirs.insert(dir.to_owned());
            }
            current = parent(dir);
        }
        Ok(())
    }

    fn info(&self, path: &str) -> FileInfo {
        let (size, mode, is_dir) = match self.files.get(path) {
            Some(data) => (
                i64::try_from(data.len()).unwrap_or(i64::MAX),
                FILE_MODE,
                false,
            ),
            None => (0, DIR_MODE, true),
        };
        FileInfo {
            name: base(path).to_owned(),
            size,
            mode,
            mod_time: MOD_TIME.to_owned(),
            is_dir,
        }
    }

    /// `file.read`.
    pub fn read(&self, path: &str) -> Result<ExecutorResponse, HelperError> {
        match self.files.get(path) {
            Some(data) => Ok(ExecutorResponse {
                data: data.clone(),
                version: content_version(data),
                ..ExecutorResponse::default()
            }),
            None if self.is_dir(path) => Err(HelperError::internal("is a directory")),
            None => Err(HelperError::NotFound),
        }
    }

    /// `file.stat`.
    pub fn stat(&self, path: &str) -> Result<ExecutorResponse, HelperError> {
        if !self.exists(path) {
            return Err(HelperError::NotFound);
        }
        Ok(ExecutorResponse {
            info: Some(self.info(path)),
            ..ExecutorResponse::default()
        })
    }

    /// `file.create`.
    pub fn create(&mut self, path: &str, data: &[u8]) -> Result<ExecutorResponse, HelperError> {
        if self.exists(path) {
            return Err(HelperError::AlreadyExists);
        }
        self.make_parents(path)?;
        self.files.insert(path.to_owned(), data.to_vec());
        Ok(version(data))
    }

    /// `file.replace`.
    pub fn replace(
        &mut self,
        path: &str,
        data: &[u8],
        expected: &str,
    ) -> Result<ExecutorResponse, HelperError> {
        let missing = if self.is_dir(path) {
            HelperError::internal("is a directory")
        } else {
            HelperError::NotFound
        };
        let current = self.files.get_mut(path).ok_or(missing)?;
        if content_version(current) != expected {
            return Err(HelperError::VersionMismatch);
        }
        *current = data.to_vec();
        Ok(version(data))
    }

    /// `file.list`: the directory's entries sorted by name, at most `limit`.
    pub fn list(&self, path: &str, limit: usize) -> Result<ExecutorResponse, HelperError> {
        if !self.is_dir(path) {
            return Err(if self.files.contains_key(path) {
                HelperError::internal("not a directory")
            } else {
                HelperError::NotFound
            });
        }
        let children: BTreeSet<&str> = self
            .files
            .keys()
            .chain(self.dirs.iter())
            .filter(|p| parent(p) == Some(path) && !p.is_empty())
            .map(String::as_str)
            .collect();
        if children.len() > limit {
            return Err(HelperError::ResourceExhausted(
                "directory has more entries than the limit",
            ));
        }
        Ok(ExecutorResponse {
            entries: children.into_iter().map(|c| self.info(c)).collect(),
            ..ExecutorResponse::default()
        })
    }

    /// `file.remove`: a file, or an empty directory.
    pub fn remove(&mut self, path: &str) -> Result<ExecutorResponse, HelperError> {
        if path.is_empty() {
            return Err(HelperError::internal("the workspace root"));
        }
        if self.files.remove(path).is_some() {
            return Ok(ExecutorResponse::default());
        }
        if !self.dirs.contains(path) {
            return Err(HelperError::NotFound);
        }
        let prefix = format!("{path}/");
        let busy = self.files.keys().any(|p| p.starts_with(&prefix))
            || self.dirs.iter().any(|p| p.starts_with(&prefix));
        if busy {
            return Err(HelperError::NotEmpty);
        }
        self.dirs.remove(path);
        Ok(ExecutorResponse::default())
    }

    /// `file.rename` and `file.copy` of a file; never over an existing destination.
    pub fn transfer(
        &mut self,
        from: &str,
        to: &str,
        keep_source: bool,
    ) -> Result<ExecutorResponse, HelperError> {
        if !self.exists(from) {
            return Err(HelperError::NotFound);
        }
        if self.exists(to) {
            return Err(HelperError::AlreadyExists);
        }
        let data = self
            .files
            .get(from)
            .cloned()
            .ok_or_else(|| HelperError::internal("directories are not transferred"))?;
        self.make_parents(to)?;
        if !keep_source {
            self.files.remove(from);
        }
        let response = version(&data);
        self.files.insert(to.to_owned(), data);
        Ok(response)
    }

    /// `file.resolve_authority`.
    pub fn resolve_authority(&self, path: &str) -> ExecutorResponse {
        let target = if path.is_empty() {
            WORKSPACE_ROOT.to_owned()
        } else {
            format!("{WORKSPACE_ROOT}/{path}")
        };
        ExecutorResponse {
            authority_target: target,
            authority_workspace: WORKSPACE_ROOT.to_owned(),
            ..ExecutorResponse::default()
        }
    }
}

fn version(data: &[u8]) -> ExecutorResponse {
    ExecutorResponse {
        version: content_version(data),
        ..ExecutorResponse::default()
    }
}
