//! The `helper_path_resolve` fuzz check: whatever the request path, a resolved path is
//! root-relative with no `..`, its canonical form stays under the root, and glob patterns
//! compile or are refused without panicking or running long.
//!
//! Shared by the fuzz target and the replay of `fuzz/regressions/helper_path_resolve/` in
//! `tests/helper_escapes.rs`.

use std::path::{Component, PathBuf};
use std::sync::OnceLock;

use execution_provider::helper::glob::GlobPattern;
use execution_provider::helper::workspace::Workspace;

/// The directory holding this process's workspace (remove it when done).
pub fn workspace_base() -> PathBuf {
    std::env::temp_dir().join(format!("helper-fuzz-{}", std::process::id()))
}

/// One workspace for the whole process, with an in-root symlink and one leading out.
fn workspace() -> &'static Workspace {
    static WORKSPACE: OnceLock<Workspace> = OnceLock::new();
    WORKSPACE.get_or_init(|| {
        let root = workspace_base().join("workspace");
        std::fs::create_dir_all(root.join("dir")).expect("a workspace");
        let _ = std::os::unix::fs::symlink("dir", root.join("inside"));
        let _ = std::os::unix::fs::symlink("/", root.join("outside"));
        Workspace::open(&root).expect("the workspace opens")
    })
}

/// Resolves `data` as a request path and compiles it as a glob; panics only on a bug.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let ws = workspace();
    if let Ok(relative) = ws.resolve(text) {
        assert!(!relative.is_absolute(), "{relative:?}");
        assert!(
            relative
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir)),
            "{relative:?}"
        );
        if let Ok(canonical) = ws.canonical(&relative) {
            assert!(canonical.starts_with(ws.root()), "{canonical:?}");
        }
    }
    if let Ok(pattern) = GlobPattern::new(text) {
        let path: Vec<&str> = text.split('/').collect();
        let _ = pattern.matches(&path);
        let _ = pattern.may_match_below(&path);
    }
}
