//! Fuzzes workspace path resolution and glob matching: whatever the request path, a resolved
//! path is root-relative with no `..`, its canonical form stays under the root, and glob
//! patterns compile or are refused without panicking or running long.
#![no_main]

use std::path::Component;
use std::sync::OnceLock;

use execution_provider::helper::glob::GlobPattern;
use execution_provider::helper::workspace::Workspace;
use libfuzzer_sys::fuzz_target;

/// One workspace for the whole run, with an in-root symlink and one leading out.
fn workspace() -> &'static Workspace {
    static WORKSPACE: OnceLock<Workspace> = OnceLock::new();
    WORKSPACE.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("helper-fuzz-{}", std::process::id()));
        let root = base.join("workspace");
        std::fs::create_dir_all(root.join("dir")).expect("a workspace");
        let _ = std::os::unix::fs::symlink("dir", root.join("inside"));
        let _ = std::os::unix::fs::symlink("/", root.join("outside"));
        Workspace::open(&root).expect("the workspace opens")
    })
}

fuzz_target!(|data: &[u8]| {
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
});
