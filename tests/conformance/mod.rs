//! Executor conformance cases: the behaviour every executor (the real `execution-helper` behind
//! any transport, or the simulator's in-memory executor) must show, written once against a
//! [`Fixture`]. Each case is an `async fn(&dyn Fixture)`; a runner gives every case a fresh,
//! empty workspace.

#![allow(dead_code)]

pub mod bounds;
/// The cases of this file, under a module name like the other groups.
pub mod core {
    pub use super::*;
}
pub mod search;

/// Calls `$runner!(module => case, ...)` for every group of cases (`core` for the cases of this
/// file), so that every transport runs exactly the same list.
#[allow(unused_macros)]
macro_rules! every_conformance_case {
    ($runner:ident) => {
        $runner!(core =>
            create_then_read_returns_the_content_and_its_sha256_version,
            create_over_an_existing_file_is_already_exists_and_keeps_the_content,
            replace_with_a_wrong_version_is_version_mismatch_and_changes_nothing,
            replace_with_the_current_version_writes_and_returns_the_new_version,
            missing_files_are_not_found,
            reading_a_directory_is_an_internal_error,
            paths_climbing_out_of_the_workspace_are_permission_denied,
            absolute_paths_outside_the_workspace_are_permission_denied,
            absolute_paths_inside_the_workspace_are_accepted,
            symlinks_leaving_the_workspace_are_permission_denied,
            symlinks_inside_the_workspace_are_followed,
            stat_reports_go_file_modes_sizes_and_times,
            list_returns_sorted_entries_without_following_symlinks,
            remove_deletes_a_file_or_an_empty_directory_and_refuses_a_non_empty_one,
            rename_and_copy_never_clobber,
            resolve_authority_returns_canonical_paths_inside_the_workspace,
            unknown_json_fields_are_invalid_argument,
            two_json_values_are_invalid_argument,
            duplicate_keys_are_invalid_argument,
            oversize_requests_are_resource_exhausted,
            provider_only_and_unknown_operations_are_invalid_argument,
            command_start_requires_an_id_and_a_bounded_command,
            a_command_reports_its_stdout_stderr_and_exit_code,
            a_command_runs_in_the_workspace_with_exactly_the_fixed_environment,
            a_command_that_exceeds_its_timeout_is_cancelled_and_its_process_group_is_gone,
            a_detached_writer_is_killed_before_the_receipt,
            output_beyond_the_cap_is_cut_and_flagged_truncated,
            reading_a_file_over_the_limit_is_resource_exhausted,
            the_receipt_is_sha256_of_the_id_nul_stdout_nul_stderr,
            closing_stdin_cancels_a_running_command,
        );
        $runner!(bounds =>
            file_content_at_and_under_the_limit_is_accepted_and_over_it_refused,
            list_at_the_limit_is_accepted_and_over_it_refused,
            the_limit_of_a_command_caps_its_output_and_the_receipt_covers_what_is_kept,
            grandchildren_that_ignore_sigterm_and_leave_the_group_are_gone_after_timeout,
            a_command_that_closes_stdout_early_still_reports_its_stderr,
            binary_output_is_repaired_to_utf8_and_covered_by_the_receipt,
            concurrent_replaces_with_the_same_version_have_exactly_one_winner,
        );
        $runner!(search =>
            glob_matches_doublestar_patterns_sorted_and_root_relative,
            glob_does_not_follow_symlinked_directories_or_report_symlinks,
            glob_over_the_limit_is_resource_exhausted,
            a_bad_glob_is_internal,
            grep_finds_matching_lines_with_paths_and_line_numbers,
            grep_never_shows_content_behind_external_symlinks,
            grep_over_the_limit_is_resource_exhausted_and_a_bad_regex_is_internal,
            grep_runs_in_linear_time_on_a_pathological_pattern,
        );
    };
}

use std::time::Duration;

use execution_provider::executor::protocol::{
    self, CommandState, ErrorCode, ExecutorEnvelope, ExecutorError, ExecutorRequest,
    ExecutorResponse, MAX_FILE_BYTES, MAX_JSON_BODY, MAX_PATH_BYTES, MODE_DIR, MODE_SYMLINK,
    Operation, content_version, terminal_receipt,
};
use execution_provider::executor::{
    BoxFuture, CancelHandle, CancelSignal, ExecutorTarget, ExecutorTransport, TransportError,
};

/// The executor under test, with an empty workspace.
pub trait Fixture: Sync {
    /// The transport that reaches the executor.
    fn transport(&self) -> &dyn ExecutorTransport;
    /// The environment whose workspace the cases use.
    fn target(&self) -> &ExecutorTarget;
    /// Sends `frame` as the helper's raw stdin request, for protocol-level cases.
    fn send_raw(&self, frame: Vec<u8>) -> BoxFuture<'_, Result<ExecutorEnvelope, TransportError>>;
    /// Setup outside the protocol: a symlink at `link` (root-relative) pointing to `target`.
    fn symlink(&self, link: &str, target: &str);
    /// The canonical absolute workspace root as the executor sees it.
    fn workspace_root(&self) -> String;
    /// Whether commands run as real processes under `/bin/sh`; the command cases are listed
    /// only for such executors (and fail if listed for another).
    fn runs_commands(&self) -> bool;
    /// Whether a process group exists (only asked when [`Fixture::runs_commands`]).
    fn process_group_alive(&self, group: i32) -> bool;
    /// Whether a process exists (only asked when [`Fixture::runs_commands`]).
    fn process_alive(&self, pid: i32) -> bool;
}

/// A case that needs real processes fails, instead of passing without running, when it is
/// listed for an executor that runs none (list it only where it can run).
pub fn require_commands(f: &dyn Fixture) {
    assert!(
        f.runs_commands(),
        "this case needs an executor that runs commands; do not list it for this one"
    );
}

/// How long a case waits for a condition.
pub const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Calling helpers.

async fn call(
    f: &dyn Fixture,
    request: ExecutorRequest,
) -> Result<ExecutorResponse, ExecutorError> {
    let envelope = f
        .transport()
        .execute(f.target(), request, CancelSignal::never())
        .await
        .expect("the transport delivers an envelope");
    envelope
        .into_outcome()
        .expect("exactly one of response and error")
}

async fn ok(f: &dyn Fixture, request: ExecutorRequest) -> ExecutorResponse {
    let what = format!("{} {:?}", request.operation, request.path);
    call(f, request)
        .await
        .unwrap_or_else(|e| panic!("{what} failed: {e}"))
}

async fn refused(f: &dyn Fixture, request: ExecutorRequest) -> ExecutorError {
    let what = format!("{} {:?}", request.operation, request.path);
    match call(f, request).await {
        Ok(response) => panic!("{what} succeeded: {response:?}"),
        Err(error) => error,
    }
}

async fn expect_code(f: &dyn Fixture, request: ExecutorRequest, code: ErrorCode) {
    let what = format!(
        "{} {:?} {:?}",
        request.operation, request.path, request.destination
    );
    let error = refused(f, request).await;
    assert_eq!(error.code, code, "{what}: {error}");
}

async fn raw(f: &dyn Fixture, frame: &[u8]) -> ExecutorError {
    let envelope = f
        .send_raw(frame.to_vec())
        .await
        .expect("the helper answers");
    envelope
        .into_outcome()
        .expect("exactly one of response and error")
        .expect_err("a malformed request is refused")
}

fn req(operation: Operation, path: &str) -> ExecutorRequest {
    ExecutorRequest::at(operation, path)
}

fn with_data(operation: Operation, path: &str, data: &[u8]) -> ExecutorRequest {
    ExecutorRequest {
        data: data.to_vec(),
        ..req(operation, path)
    }
}

fn replace(path: &str, data: &[u8], version: &str) -> ExecutorRequest {
    ExecutorRequest {
        version: version.to_owned(),
        ..with_data(Operation::FileReplace, path, data)
    }
}

fn two_paths(operation: Operation, path: &str, destination: &str) -> ExecutorRequest {
    ExecutorRequest {
        destination: destination.to_owned(),
        ..req(operation, path)
    }
}

fn command(id: &str, script: &str, timeout_ms: i64) -> ExecutorRequest {
    ExecutorRequest {
        timeout_ms,
        ..ExecutorRequest::command(id, script)
    }
}

async fn read_text(f: &dyn Fixture, path: &str) -> String {
    let response = ok(f, req(Operation::FileRead, path)).await;
    String::from_utf8(response.data).expect("UTF-8 content")
}

async fn create(f: &dyn Fixture, path: &str, data: &[u8]) -> String {
    ok(f, with_data(Operation::FileCreate, path, data))
        .await
        .version
}

async fn run(f: &dyn Fixture, request: ExecutorRequest) -> protocol::CommandStatus {
    ok(f, request)
        .await
        .command
        .expect("command.start answers a command status")
}

/// Polls `condition` until it holds or [`PATIENCE`] runs out.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let polled = tokio::time::timeout(PATIENCE, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(polled.is_ok(), "timed out waiting until {what}");
}

fn assert_receipt(status: &protocol::CommandStatus) {
    assert_eq!(
        status.terminal_receipt,
        terminal_receipt(&status.command_id, &status.stdout, &status.stderr),
        "receipt = sha256(id NUL stdout NUL stderr)"
    );
}

// ---------------------------------------------------------------------------------------------
// Files.

pub async fn create_then_read_returns_the_content_and_its_sha256_version(f: &dyn Fixture) {
    let version = create(f, "notes/hello.txt", b"hello\n").await;
    assert_eq!(version, content_version(b"hello\n"));
    assert_eq!(
        version,
        "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    );
    let read = ok(f, req(Operation::FileRead, "notes/hello.txt")).await;
    assert_eq!(read.data, b"hello\n");
    assert_eq!(read.version, version);
    let empty = create(f, "empty", b"").await;
    assert_eq!(empty, content_version(b""));
    let read = ok(f, req(Operation::FileRead, "./notes//hello.txt")).await;
    assert_eq!(read.version, version);
}

pub async fn create_over_an_existing_file_is_already_exists_and_keeps_the_content(f: &dyn Fixture) {
    create(f, "a.txt", b"first").await;
    expect_code(
        f,
        with_data(Operation::FileCreate, "a.txt", b"second"),
        ErrorCode::AlreadyExists,
    )
    .await;
    assert_eq!(read_text(f, "a.txt").await, "first");
    create(f, "dir/x", b"").await;
    expect_code(
        f,
        with_data(Operation::FileCreate, "dir", b"x"),
        ErrorCode::AlreadyExists,
    )
    .await;
}

pub async fn replace_with_a_wrong_version_is_version_mismatch_and_changes_nothing(f: &dyn Fixture) {
    let version = create(f, "a.txt", b"one").await;
    let wrong = content_version(b"something else");
    expect_code(
        f,
        replace("a.txt", b"two", &wrong),
        ErrorCode::VersionMismatch,
    )
    .await;
    expect_code(f, replace("a.txt", b"two", ""), ErrorCode::VersionMismatch).await;
    expect_code(
        f,
        replace("a.txt", b"two", &version.to_uppercase()),
        ErrorCode::VersionMismatch,
    )
    .await;
    let read = ok(f, req(Operation::FileRead, "a.txt")).await;
    assert_eq!(read.data, b"one");
    assert_eq!(read.version, version);
}

pub async fn replace_with_the_current_version_writes_and_returns_the_new_version(f: &dyn Fixture) {
    let v1 = create(f, "a.txt", b"a much longer first version").await;
    let v2 = ok(f, replace("a.txt", b"short", &v1)).await.version;
    assert_eq!(v2, content_version(b"short"));
    assert_eq!(read_text(f, "a.txt").await, "short");
    expect_code(
        f,
        replace("a.txt", b"again", &v1),
        ErrorCode::VersionMismatch,
    )
    .await;
    expect_code(f, replace("missing.txt", b"x", &v1), ErrorCode::NotFound).await;
}

pub async fn missing_files_are_not_found(f: &dyn Fixture) {
    expect_code(f, req(Operation::FileRead, "nope.txt"), ErrorCode::NotFound).await;
    expect_code(
        f,
        req(Operation::FileStat, "nope/deeper"),
        ErrorCode::NotFound,
    )
    .await;
    expect_code(
        f,
        req(Operation::FileRemove, "nope.txt"),
        ErrorCode::NotFound,
    )
    .await;
    expect_code(f, req(Operation::FileList, "nope"), ErrorCode::NotFound).await;
    expect_code(
        f,
        two_paths(Operation::FileRename, "nope", "b"),
        ErrorCode::NotFound,
    )
    .await;
    expect_code(
        f,
        two_paths(Operation::FileCopy, "nope", "b"),
        ErrorCode::NotFound,
    )
    .await;
}

pub async fn reading_a_directory_is_an_internal_error(f: &dyn Fixture) {
    create(f, "d/x", b"").await;
    let error = refused(f, req(Operation::FileRead, "d")).await;
    assert_eq!(error.code, ErrorCode::Internal);
    assert_eq!(
        error.message, "executor operation failed",
        "no raw OS message leaks"
    );
}

pub async fn paths_climbing_out_of_the_workspace_are_permission_denied(f: &dyn Fixture) {
    create(f, "inside.txt", b"x").await;
    for path in ["../x", "a/../../x", "..", "../../../../etc/passwd"] {
        expect_code(
            f,
            req(Operation::FileRead, path),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            req(Operation::FileStat, path),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            with_data(Operation::FileCreate, path, b"x"),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            req(Operation::FileRemove, path),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            req(Operation::FileList, path),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            two_paths(Operation::FileRename, "inside.txt", path),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            two_paths(Operation::FileCopy, "inside.txt", path),
            ErrorCode::PermissionDenied,
        )
        .await;
    }
    assert_eq!(read_text(f, "inside.txt").await, "x");
}

pub async fn absolute_paths_outside_the_workspace_are_permission_denied(f: &dyn Fixture) {
    let root = f.workspace_root();
    for path in [
        "/etc/passwd".to_owned(),
        "/".to_owned(),
        format!("{root}/../escape.txt"),
    ] {
        expect_code(
            f,
            req(Operation::FileRead, &path),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            req(Operation::FileStat, &path),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            with_data(Operation::FileCreate, &path, b"x"),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            req(Operation::FileResolveAuthority, &path),
            ErrorCode::PermissionDenied,
        )
        .await;
    }
}

pub async fn absolute_paths_inside_the_workspace_are_accepted(f: &dyn Fixture) {
    let root = f.workspace_root();
    create(f, &format!("{root}/sub/abs.txt"), b"abs").await;
    assert_eq!(read_text(f, "sub/abs.txt").await, "abs");
    assert_eq!(
        read_text(f, &format!("{root}/sub/../sub/abs.txt")).await,
        "abs"
    );
    let info = ok(f, req(Operation::FileStat, &root))
        .await
        .info
        .expect("info");
    assert!(info.is_dir);
}

pub async fn symlinks_leaving_the_workspace_are_permission_denied(f: &dyn Fixture) {
    f.symlink("slash", "/");
    f.symlink("passwd", "/etc/passwd");
    f.symlink("up", "..");
    f.symlink("hop", "slash/etc");
    for path in ["slash/etc/passwd", "passwd", "up/x", "hop/passwd", "slash"] {
        expect_code(
            f,
            req(Operation::FileRead, path),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            req(Operation::FileStat, path),
            ErrorCode::PermissionDenied,
        )
        .await;
        expect_code(
            f,
            req(Operation::FileResolveAuthority, path),
            ErrorCode::PermissionDenied,
        )
        .await;
    }
    expect_code(
        f,
        req(Operation::FileList, "slash"),
        ErrorCode::PermissionDenied,
    )
    .await;
    expect_code(
        f,
        replace("passwd", b"x", &content_version(b"")),
        ErrorCode::PermissionDenied,
    )
    .await;
    expect_code(
        f,
        with_data(Operation::FileCreate, "slash/tmp/escaped", b"x"),
        ErrorCode::PermissionDenied,
    )
    .await;
    expect_code(
        f,
        with_data(Operation::FileCreate, "up/escaped", b"x"),
        ErrorCode::PermissionDenied,
    )
    .await;
    expect_code(
        f,
        two_paths(Operation::FileCopy, "passwd", "copy"),
        ErrorCode::PermissionDenied,
    )
    .await;
    expect_code(
        f,
        req(Operation::FileRemove, "passwd"),
        ErrorCode::PermissionDenied,
    )
    .await;
    let root = f.workspace_root();
    expect_code(
        f,
        req(Operation::FileRead, &format!("{root}/slash/etc/passwd")),
        ErrorCode::PermissionDenied,
    )
    .await;
}

pub async fn symlinks_inside_the_workspace_are_followed(f: &dyn Fixture) {
    create(f, "real/f.txt", b"through the link").await;
    f.symlink("alias", "real");
    f.symlink("leaf", "real/f.txt");
    assert_eq!(read_text(f, "alias/f.txt").await, "through the link");
    assert_eq!(read_text(f, "leaf").await, "through the link");
    let info = ok(f, req(Operation::FileStat, "alias"))
        .await
        .info
        .expect("info");
    assert!(info.is_dir, "stat follows in-root symlinks");
    let root = f.workspace_root();
    let authority = ok(f, req(Operation::FileResolveAuthority, "alias/f.txt")).await;
    assert_eq!(authority.authority_target, format!("{root}/real/f.txt"));
    assert_eq!(authority.authority_workspace, root);
}

pub async fn stat_reports_go_file_modes_sizes_and_times(f: &dyn Fixture) {
    create(f, "d/file.bin", &[7u8; 1234]).await;
    let file = ok(f, req(Operation::FileStat, "d/file.bin"))
        .await
        .info
        .expect("info");
    assert_eq!(file.name, "file.bin");
    assert_eq!(file.size, 1234);
    assert!(!file.is_dir);
    assert_eq!(file.mode & !0o777, 0, "a regular file has no type bits");
    assert_eq!(file.mode & 0o600, 0o600);
    assert!(
        file.mod_time.ends_with('Z') && file.mod_time.contains('T'),
        "{}",
        file.mod_time
    );
    let dir = ok(f, req(Operation::FileStat, "d"))
        .await
        .info
        .expect("info");
    assert!(dir.is_dir);
    assert_eq!(dir.mode & MODE_DIR, MODE_DIR);
    let root = ok(f, req(Operation::FileStat, ""))
        .await
        .info
        .expect("info");
    assert!(root.is_dir);
}

pub async fn list_returns_sorted_entries_without_following_symlinks(f: &dyn Fixture) {
    create(f, "b.txt", b"bb").await;
    create(f, "a.txt", b"a").await;
    create(f, "dir/inner.txt", b"").await;
    f.symlink("link", "a.txt");
    let entries = ok(f, req(Operation::FileList, ".")).await.entries;
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["a.txt", "b.txt", "dir", "link"]);
    assert_eq!(entries[1].size, 2);
    assert!(entries[2].is_dir && entries[2].mode & MODE_DIR != 0);
    assert_eq!(
        entries[3].mode & MODE_SYMLINK,
        MODE_SYMLINK,
        "entries are not followed"
    );
    assert!(!entries[3].is_dir);
    let inner = ok(f, req(Operation::FileList, "dir")).await.entries;
    assert_eq!(inner.len(), 1);
    assert_eq!(inner[0].name, "inner.txt");
    let limited = ExecutorRequest {
        limit: 3,
        ..req(Operation::FileList, "")
    };
    expect_code(f, limited, ErrorCode::ResourceExhausted).await;
    create(f, "empty/.keep", b"").await;
    ok(f, req(Operation::FileRemove, "empty/.keep")).await;
    assert!(
        ok(f, req(Operation::FileList, "empty"))
            .await
            .entries
            .is_empty()
    );
}

pub async fn remove_deletes_a_file_or_an_empty_directory_and_refuses_a_non_empty_one(
    f: &dyn Fixture,
) {
    create(f, "full/file.txt", b"x").await;
    expect_code(f, req(Operation::FileRemove, "full"), ErrorCode::Conflict).await;
    ok(f, req(Operation::FileRemove, "full/file.txt")).await;
    expect_code(
        f,
        req(Operation::FileRead, "full/file.txt"),
        ErrorCode::NotFound,
    )
    .await;
    ok(f, req(Operation::FileRemove, "full")).await;
    expect_code(f, req(Operation::FileStat, "full"), ErrorCode::NotFound).await;
}

pub async fn rename_and_copy_never_clobber(f: &dyn Fixture) {
    create(f, "a.txt", b"A").await;
    create(f, "b.txt", b"B").await;
    expect_code(
        f,
        two_paths(Operation::FileRename, "a.txt", "b.txt"),
        ErrorCode::AlreadyExists,
    )
    .await;
    expect_code(
        f,
        two_paths(Operation::FileCopy, "a.txt", "b.txt"),
        ErrorCode::AlreadyExists,
    )
    .await;
    assert_eq!(read_text(f, "b.txt").await, "B");
    let copied = ok(f, two_paths(Operation::FileCopy, "a.txt", "copies/a.txt")).await;
    assert_eq!(copied.version, content_version(b"A"));
    ok(f, two_paths(Operation::FileRename, "a.txt", "moved/a.txt")).await;
    expect_code(f, req(Operation::FileRead, "a.txt"), ErrorCode::NotFound).await;
    assert_eq!(read_text(f, "moved/a.txt").await, "A");
    assert_eq!(read_text(f, "copies/a.txt").await, "A");
    create(f, "d/x", b"").await;
    expect_code(
        f,
        two_paths(Operation::FileCopy, "d", "d2"),
        ErrorCode::Internal,
    )
    .await;
}

pub async fn resolve_authority_returns_canonical_paths_inside_the_workspace(f: &dyn Fixture) {
    let root = f.workspace_root();
    let authority = ok(f, req(Operation::FileResolveAuthority, "a/not-yet.txt")).await;
    assert_eq!(authority.authority_target, format!("{root}/a/not-yet.txt"));
    assert_eq!(authority.authority_workspace, root);
    let authority = ok(f, req(Operation::FileResolveAuthority, "")).await;
    assert_eq!(authority.authority_target, root);
}

// ---------------------------------------------------------------------------------------------
// Request validation.

pub async fn unknown_json_fields_are_invalid_argument(f: &dyn Fixture) {
    let error = raw(
        f,
        br#"{"operation":"file.read","path":"a","argv":["/bin/sh"]}"#,
    )
    .await;
    assert_eq!(error.code, ErrorCode::InvalidArgument);
    assert!(
        error.message.starts_with("invalid JSON"),
        "{}",
        error.message
    );
    let error = raw(f, br#"{"operation":"file.read","path":["a"]}"#).await;
    assert_eq!(error.code, ErrorCode::InvalidArgument);
    let error = raw(f, b"not json").await;
    assert_eq!(error.code, ErrorCode::InvalidArgument);
}

pub async fn two_json_values_are_invalid_argument(f: &dyn Fixture) {
    let error = raw(f, br#"{"operation":"file.stat"} {"operation":"file.stat"}"#).await;
    assert_eq!(error.code, ErrorCode::InvalidArgument);
    assert_eq!(error.message, "request must contain exactly one JSON value");
}

pub async fn duplicate_keys_are_invalid_argument(f: &dyn Fixture) {
    let error = raw(
        f,
        br#"{"operation":"file.stat","path":"a","path":"/etc/passwd"}"#,
    )
    .await;
    assert_eq!(error.code, ErrorCode::InvalidArgument);
    let error = raw(f, br#"{"operation":"file.stat","operation":"file.read"}"#).await;
    assert_eq!(error.code, ErrorCode::InvalidArgument);
}

pub async fn oversize_requests_are_resource_exhausted(f: &dyn Fixture) {
    // Over the 8 MiB framing limit: refused before sending.
    let huge = with_data(Operation::FileCreate, "huge", &vec![0u8; MAX_JSON_BODY]);
    let error = f
        .transport()
        .execute(f.target(), huge, CancelSignal::never())
        .await
        .expect_err("an encoding over 8 MiB is not sent");
    assert_eq!(error.code(), Some(ErrorCode::ResourceExhausted));
    // A raw frame over 8 MiB reaching the helper.
    let mut frame = br#"{"operation":"file.stat","path":""#.to_vec();
    frame.resize(MAX_JSON_BODY + 10, b'a');
    frame.extend_from_slice(br#""}"#);
    assert_eq!(raw(f, &frame).await.code, ErrorCode::ResourceExhausted);
    // Under the framing limit but over the per-field bounds.
    let big = with_data(Operation::FileCreate, "big", &vec![1u8; MAX_FILE_BYTES + 1]);
    expect_code(f, big, ErrorCode::ResourceExhausted).await;
    expect_code(f, req(Operation::FileStat, "big"), ErrorCode::NotFound).await;
    let long = "d/".repeat(MAX_PATH_BYTES / 2 + 1);
    expect_code(
        f,
        req(Operation::FileStat, &long),
        ErrorCode::ResourceExhausted,
    )
    .await;
    let negative = ExecutorRequest {
        limit: -1,
        ..req(Operation::FileList, "")
    };
    expect_code(f, negative, ErrorCode::ResourceExhausted).await;
    // Exactly the file limit is fine, and reads back.
    let limit = vec![2u8; MAX_FILE_BYTES];
    create(f, "limit.bin", &limit).await;
    assert_eq!(
        ok(f, req(Operation::FileRead, "limit.bin"))
            .await
            .data
            .len(),
        MAX_FILE_BYTES
    );
}

pub async fn provider_only_and_unknown_operations_are_invalid_argument(f: &dyn Fixture) {
    for word in [
        Operation::Attach,
        Operation::RunAcquire,
        Operation::CommandStatus,
        Operation::Retire,
    ] {
        let error = refused(f, ExecutorRequest::new(word)).await;
        assert_eq!(error.code, ErrorCode::InvalidArgument);
        assert_eq!(
            error.message,
            "operation is handled by provider, not workload"
        );
    }
    let error = refused(
        f,
        ExecutorRequest::new(Operation::Unknown("file.chmod".into())),
    )
    .await;
    assert_eq!(error.code, ErrorCode::InvalidArgument);
    assert_eq!(error.message, "unsupported executor operation");
}

pub async fn command_start_requires_an_id_and_a_bounded_command(f: &dyn Fixture) {
    expect_code(f, command("", "true", 0), ErrorCode::InvalidArgument).await;
    expect_code(f, command("c", "", 0), ErrorCode::InvalidArgument).await;
    let long = "#".repeat(protocol::MAX_COMMAND_BYTES + 1);
    expect_code(f, command("c", &long, 0), ErrorCode::InvalidArgument).await;
}

// ---------------------------------------------------------------------------------------------
// Commands (listed only for executors that run real processes).

pub async fn a_command_reports_its_stdout_stderr_and_exit_code(f: &dyn Fixture) {
    require_commands(f);
    let status = run(f, command("c-ok", "echo out; echo err >&2", 0)).await;
    assert_eq!(status.command_id, "c-ok");
    assert_eq!(status.state, CommandState::Succeeded);
    assert_eq!(status.exit_code, 0);
    assert_eq!(status.stdout, b"out\n");
    assert_eq!(status.stderr, b"err\n");
    assert!(!status.truncated);
    assert_receipt(&status);
    let status = run(f, command("c-fail", "printf partial; exit 3", 0)).await;
    assert_eq!(status.state, CommandState::Failed);
    assert_eq!(status.exit_code, 3);
    assert_eq!(status.stdout, b"partial");
    assert_receipt(&status);
    let status = run(f, command("c-signal", "kill -9 $$", 0)).await;
    assert_eq!(status.state, CommandState::Failed);
    assert_eq!(status.exit_code, -1);
}

pub async fn a_command_runs_in_the_workspace_with_exactly_the_fixed_environment(f: &dyn Fixture) {
    require_commands(f);
    let root = f.workspace_root();
    let status = run(f, command("c-env", "pwd; env | sort", 0)).await;
    assert_eq!(status.state, CommandState::Succeeded);
    let stdout = String::from_utf8(status.stdout).unwrap();
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(root.as_str()));
    let env: Vec<&str> = lines
        .filter(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL=") && !l.starts_with("_="))
        .collect();
    assert_eq!(
        env,
        [
            "GOTMPDIR=/tmp".to_owned(),
            format!("HOME={root}"),
            "PATH=/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin".to_owned(),
            "TMPDIR=/tmp".to_owned(),
        ]
    );
    run(f, command("c-write", "echo made > made.txt", 0)).await;
    assert_eq!(read_text(f, "made.txt").await, "made\n");
}

pub async fn a_command_that_exceeds_its_timeout_is_cancelled_and_its_process_group_is_gone(
    f: &dyn Fixture,
) {
    require_commands(f);
    let script = "echo $$ > group.pid; sleep 60 & sleep 60; echo unreachable";
    let status = run(f, command("c-timeout", script, 300)).await;
    assert_eq!(status.state, CommandState::Cancelled);
    assert_eq!(status.exit_code, -1);
    assert!(status.stdout.is_empty());
    assert_receipt(&status);
    let group: i32 = read_text(f, "group.pid")
        .await
        .trim()
        .parse()
        .expect("a pid");
    eventually("the command's process group is gone", || {
        !f.process_group_alive(group)
    })
    .await;
}

pub async fn a_detached_writer_is_killed_before_the_receipt(f: &dyn Fixture) {
    require_commands(f);
    // `setsid` leaves the command's process group; only the subreaper sweep can find it.
    let script = "setsid sh -c 'echo $$ > bg.pid; while :; do echo tick >> bg.log; sleep 0.01; done' \
                  </dev/null >/dev/null 2>&1 & \
                  while [ ! -s bg.pid ]; do :; done; echo started";
    let status = run(f, command("c-detached", script, 10_000)).await;
    assert_eq!(status.state, CommandState::Succeeded, "{status:?}");
    assert_eq!(status.stdout, b"started\n");
    assert_receipt(&status);
    let pid: i32 = read_text(f, "bg.pid").await.trim().parse().expect("a pid");
    assert!(
        !f.process_alive(pid),
        "the detached writer was reaped before the answer"
    );
}

pub async fn output_beyond_the_cap_is_cut_and_flagged_truncated(f: &dyn Fixture) {
    require_commands(f);
    let script = "head -c 6000000 /dev/zero | tr '\\0' 'a'; echo tail >&2";
    let status = run(f, command("c-big", script, 0)).await;
    assert_eq!(
        status.state,
        CommandState::Succeeded,
        "a command is never an error for its output size"
    );
    assert!(status.truncated);
    assert_eq!(status.stdout.len(), MAX_FILE_BYTES);
    assert!(status.stdout.iter().all(|&b| b == b'a'));
    assert!(status.stderr.is_empty(), "stdout used the whole cap");
    assert_receipt(&status);
    let status = run(f, command("c-small", "printf 'a\\377b'", 0)).await;
    assert_eq!(
        status.stdout,
        "a\u{fffd}b".as_bytes(),
        "output is repaired to UTF-8"
    );
    assert!(!status.truncated);
}

pub async fn reading_a_file_over_the_limit_is_resource_exhausted(f: &dyn Fixture) {
    require_commands(f);
    run(
        f,
        command("c-bigfile", "head -c 5242881 /dev/zero > big.bin", 0),
    )
    .await;
    let error = refused(f, req(Operation::FileRead, "big.bin")).await;
    assert_eq!(error.code, ErrorCode::ResourceExhausted);
    let info = ok(f, req(Operation::FileStat, "big.bin"))
        .await
        .info
        .expect("info");
    assert_eq!(info.size, MAX_FILE_BYTES as i64 + 1);
}

pub async fn the_receipt_is_sha256_of_the_id_nul_stdout_nul_stderr(f: &dyn Fixture) {
    require_commands(f);
    let status = run(f, command("receipt-1", "printf out; printf err >&2", 0)).await;
    assert_eq!(
        status.terminal_receipt,
        content_version(b"receipt-1\0out\0err")
    );
    let other = run(f, command("receipt-2", "printf out; printf err >&2", 0)).await;
    assert_ne!(
        other.terminal_receipt, status.terminal_receipt,
        "the id is bound"
    );
}

pub async fn closing_stdin_cancels_a_running_command(f: &dyn Fixture) {
    require_commands(f);
    let (handle, signal) = CancelHandle::new();
    let request = command("c-cancel", "echo $$ > cancel.pid; echo begun; sleep 60", 0);
    let running = f.transport().execute(f.target(), request, signal);
    let cancel_when_started = async {
        let started = tokio::time::timeout(PATIENCE, async {
            loop {
                let read = call(f, req(Operation::FileRead, "cancel.pid")).await;
                if read.is_ok_and(|r| !r.data.is_empty()) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(started.is_ok(), "the command started");
        handle.cancel();
    };
    let (envelope, ()) = tokio::join!(running, cancel_when_started);
    let status = envelope
        .expect("the helper answers after a cancel")
        .into_outcome()
        .expect("one outcome")
        .expect("a command status")
        .command
        .expect("command");
    assert_eq!(status.state, CommandState::Cancelled);
    assert_eq!(status.stdout, b"begun\n");
    assert_receipt(&status);
    let group: i32 = read_text(f, "cancel.pid")
        .await
        .trim()
        .parse()
        .expect("a pid");
    eventually("the cancelled command's group is gone", || {
        !f.process_group_alive(group)
    })
    .await;
}
