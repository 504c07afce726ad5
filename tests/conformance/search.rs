//! Conformance cases for `file.glob` and `file.grep`.

use execution_provider::executor::protocol::{ErrorCode, ExecutorRequest, GrepMatch, Operation};

use super::{Fixture, create, expect_code, ok};

fn glob_request(pattern: &str, limit: i64) -> ExecutorRequest {
    ExecutorRequest {
        pattern: pattern.to_owned(),
        limit,
        ..ExecutorRequest::new(Operation::FileGlob)
    }
}

fn grep_request(pattern: &str, files: &str, limit: i64) -> ExecutorRequest {
    ExecutorRequest {
        pattern: pattern.to_owned(),
        path: files.to_owned(),
        limit,
        ..ExecutorRequest::new(Operation::FileGrep)
    }
}

async fn glob(f: &dyn Fixture, pattern: &str) -> Vec<String> {
    ok(f, glob_request(pattern, 0)).await.paths
}

async fn tree(f: &dyn Fixture) {
    for path in [
        "README.md",
        "src/main.rs",
        "src/lib.rs",
        "src/deep/nested/mod.rs",
        "docs/guide.md",
        ".hidden/x.rs",
        "a1.txt",
        "b2.txt",
    ] {
        create(f, path, b"x\n").await;
    }
}

pub async fn glob_matches_doublestar_patterns_sorted_and_root_relative(f: &dyn Fixture) {
    tree(f).await;
    assert_eq!(glob(f, "*.md").await, ["README.md"]);
    assert_eq!(
        glob(f, "**/*.rs").await,
        [
            ".hidden/x.rs",
            "src/deep/nested/mod.rs",
            "src/lib.rs",
            "src/main.rs"
        ]
    );
    assert_eq!(glob(f, "src/*.rs").await, ["src/lib.rs", "src/main.rs"]);
    assert_eq!(glob(f, "?1.txt").await, ["a1.txt"]);
    assert_eq!(glob(f, "[ab][0-9].txt").await, ["a1.txt", "b2.txt"]);
    assert_eq!(
        glob(f, "{docs,src}/*.{md,rs}").await,
        ["docs/guide.md", "src/lib.rs", "src/main.rs"]
    );
    assert_eq!(
        glob(f, "/src/lib.rs").await,
        ["src/lib.rs"],
        "leading / dropped"
    );
    assert_eq!(glob(f, "./src/lib.rs").await, ["src/lib.rs"]);
    assert_eq!(
        glob(f, "src/*").await,
        ["src/deep", "src/lib.rs", "src/main.rs"],
        "directories match too"
    );
    assert!(glob(f, "").await.is_empty());
    assert!(glob(f, ".").await.is_empty());
    assert!(glob(f, "nothing/*").await.is_empty());
}

pub async fn glob_does_not_follow_symlinked_directories_or_report_symlinks(f: &dyn Fixture) {
    create(f, "real/inner.txt", b"x").await;
    f.symlink("alias", "real");
    f.symlink("outside", "/etc");
    f.symlink("leaf.txt", "real/inner.txt");
    assert_eq!(glob(f, "**").await, ["real", "real/inner.txt"]);
    assert!(glob(f, "outside/*").await.is_empty());
    assert!(glob(f, "alias/*").await.is_empty());
    assert!(
        glob(f, "*.txt").await.is_empty(),
        "symlink leaves are dropped"
    );
}

pub async fn glob_over_the_limit_is_resource_exhausted(f: &dyn Fixture) {
    for name in ["a", "b", "c"] {
        create(f, name, b"").await;
    }
    assert_eq!(ok(f, glob_request("*", 3)).await.paths, ["a", "b", "c"]);
    expect_code(f, glob_request("*", 2), ErrorCode::ResourceExhausted).await;
}

pub async fn a_bad_glob_is_internal(f: &dyn Fixture) {
    expect_code(f, glob_request("[abc", 0), ErrorCode::Internal).await;
    expect_code(f, glob_request("{a,b", 0), ErrorCode::Internal).await;
}

fn found(path: &str, line: i64, text: &str) -> GrepMatch {
    GrepMatch {
        path: path.to_owned(),
        line,
        text: text.to_owned(),
    }
}

pub async fn grep_finds_matching_lines_with_paths_and_line_numbers(f: &dyn Fixture) {
    create(f, "a.txt", b"alpha\nbeta\ngamma\n").await;
    create(f, "dir/b.rs", b"fn beta() {}\n// alpha\n").await;
    create(f, "bin.dat", b"alpha\0beta\n").await;
    create(f, "latin.txt", b"alpha \xff\n").await;
    let response = ok(f, grep_request("^(alpha|fn beta)", "", 0)).await;
    assert_eq!(
        response.matches,
        [
            found("a.txt", 1, "alpha"),
            found("dir/b.rs", 1, "fn beta() {}"),
            found("latin.txt", 1, "alpha \u{fffd}"),
        ],
        "files with a NUL byte are skipped, invalid UTF-8 is repaired"
    );
    let response = ok(f, grep_request("alpha", "**/*.rs", 0)).await;
    assert_eq!(response.matches, [found("dir/b.rs", 2, "// alpha")]);
    let response = ok(f, grep_request("(et|mm)a$", "a.txt", 0)).await;
    assert_eq!(
        response.matches,
        [found("a.txt", 2, "beta"), found("a.txt", 3, "gamma")]
    );
}

pub async fn grep_never_shows_content_behind_external_symlinks(f: &dyn Fixture) {
    create(f, "inside.txt", b"root:inside\n").await;
    f.symlink("passwd", "/etc/passwd");
    f.symlink("etc", "/etc");
    f.symlink("inner-link.txt", "inside.txt");
    let response = ok(f, grep_request("root", "", 0)).await;
    assert_eq!(response.matches, [found("inside.txt", 1, "root:inside")]);
    let response = ok(f, grep_request("root", "etc/*", 0)).await;
    assert!(response.matches.is_empty());
}

pub async fn grep_over_the_limit_is_resource_exhausted_and_a_bad_regex_is_internal(
    f: &dyn Fixture,
) {
    create(f, "many.txt", b"x\nx\nx\n").await;
    assert_eq!(ok(f, grep_request("x", "", 3)).await.matches.len(), 3);
    expect_code(f, grep_request("x", "", 2), ErrorCode::ResourceExhausted).await;
    expect_code(f, grep_request("(unclosed", "", 0), ErrorCode::Internal).await;
    // Backreferences are not RE2 and are refused rather than run in exponential time.
    expect_code(f, grep_request("(a)\\1", "", 0), ErrorCode::Internal).await;
}

pub async fn grep_runs_in_linear_time_on_a_pathological_pattern(f: &dyn Fixture) {
    let line = format!("{}!\n", "a".repeat(100_000));
    create(f, "long.txt", line.as_bytes()).await;
    let response = tokio::time::timeout(super::PATIENCE, ok(f, grep_request("^(a+)+$", "", 0)))
        .await
        .expect("a catastrophic-backtracking pattern finishes");
    assert!(response.matches.is_empty());
}
