//! Escape attempts that need file-system setup beyond the conformance fixture: symlinks swapped
//! by a concurrent writer, hard links, FIFOs and devices, very long paths and names that are
//! not UTF-8. Each runs the real `execution-helper` through `LocalTransport` and checks both the
//! answer and that nothing outside the workspace was read or touched. Also replays the
//! committed fuzz regressions of the helper's request decoding and path resolution
//! (`fuzz/regressions/`, docs/testing.md).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use execution_provider::executor::protocol::{
    ErrorCode, ExecutorError, ExecutorResponse, MAX_PATH_BYTES, MODE_NAMED_PIPE, content_version,
};
use execution_provider::executor::{
    CancelSignal, ExecutorRequest, ExecutorTarget, ExecutorTransport, LocalTransport, Operation,
};

/// A workspace beside an `outside` directory holding `secret.txt`.
struct Sandbox {
    temp: tempfile::TempDir,
    root: PathBuf,
    transport: LocalTransport,
    target: ExecutorTarget,
}

impl Sandbox {
    fn new() -> Self {
        let temp = tempfile::tempdir().unwrap();
        let workspaces = temp.path().join("workspaces");
        let root = workspaces.join("exec-escape");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir(temp.path().join("outside")).unwrap();
        std::fs::write(temp.path().join("outside/secret.txt"), b"SECRET\n").unwrap();
        Self {
            root: std::fs::canonicalize(&root).unwrap(),
            transport: LocalTransport::unisolated(
                env!("CARGO_BIN_EXE_execution-helper"),
                workspaces,
            ),
            target: ExecutorTarget {
                namespace: "execution".into(),
                pod_name: "executor-escape".into(),
                environment: "exec-escape".into(),
            },
            temp,
        }
    }

    fn outside(&self) -> PathBuf {
        self.temp.path().join("outside")
    }

    fn secret_untouched(&self) {
        assert_eq!(
            std::fs::read(self.outside().join("secret.txt")).unwrap(),
            b"SECRET\n"
        );
        let names: Vec<_> = std::fs::read_dir(self.outside()).unwrap().collect();
        assert_eq!(names.len(), 1, "nothing was created outside");
    }

    async fn call(&self, request: ExecutorRequest) -> Result<ExecutorResponse, ExecutorError> {
        self.transport
            .execute(&self.target, request, CancelSignal::never())
            .await
            .expect("an envelope")
            .into_outcome()
            .expect("one outcome")
    }

    async fn code(&self, request: ExecutorRequest) -> ErrorCode {
        match self.call(request).await {
            Ok(response) => panic!("unexpectedly succeeded: {response:?}"),
            Err(error) => error.code,
        }
    }
}

fn with_data(operation: Operation, path: &str, data: &[u8]) -> ExecutorRequest {
    ExecutorRequest {
        data: data.to_vec(),
        ..ExecutorRequest::at(operation, path)
    }
}

#[tokio::test]
async fn a_symlink_swapped_by_a_concurrent_writer_never_leads_outside() {
    let sandbox = Sandbox::new();
    std::fs::create_dir(sandbox.root.join("real")).unwrap();
    std::fs::write(sandbox.root.join("real/secret.txt"), b"inside\n").unwrap();
    std::os::unix::fs::symlink("real", sandbox.root.join("a")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (root, outside, stop) = (sandbox.root.clone(), sandbox.outside(), stop.clone());
        std::thread::spawn(move || {
            let mut flip = false;
            while !stop.load(Ordering::Relaxed) {
                let target: &Path = if flip { Path::new("real") } else { &outside };
                let _ = std::fs::remove_file(root.join("a.next"));
                std::os::unix::fs::symlink(target, root.join("a.next")).unwrap();
                std::fs::rename(root.join("a.next"), root.join("a")).unwrap();
                flip = !flip;
            }
        })
    };
    let absolute = format!("{}/a/secret.txt", sandbox.root.display());
    for round in 0..40 {
        let reads = [
            ExecutorRequest::at(Operation::FileRead, "a/secret.txt"),
            ExecutorRequest::at(Operation::FileRead, absolute.clone()),
            with_data(Operation::FileCreate, &format!("a/new-{round}"), b"x"),
            ExecutorRequest::at(Operation::FileStat, "a/secret.txt"),
        ];
        let answers = futures::future::join_all(reads.map(|r| sandbox.call(r))).await;
        for answer in answers {
            match answer {
                Ok(response) => assert_ne!(response.data, b"SECRET\n", "outside content leaked"),
                Err(error) => assert!(
                    matches!(
                        error.code,
                        ErrorCode::PermissionDenied | ErrorCode::AlreadyExists
                    ),
                    "{error}"
                ),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    sandbox.secret_untouched();
}

#[tokio::test]
async fn a_hard_link_to_a_file_outside_is_refused_and_the_file_is_untouched() {
    let sandbox = Sandbox::new();
    std::fs::hard_link(
        sandbox.outside().join("secret.txt"),
        sandbox.root.join("alias"),
    )
    .unwrap();
    let secret_version = content_version(b"SECRET\n");
    let denied = ErrorCode::PermissionDenied;
    let read = ExecutorRequest::at(Operation::FileRead, "alias");
    assert_eq!(sandbox.code(read).await, denied);
    let replace = ExecutorRequest {
        version: secret_version,
        ..with_data(Operation::FileReplace, "alias", b"overwritten")
    };
    assert_eq!(sandbox.code(replace).await, denied);
    let copy = ExecutorRequest {
        destination: "copied".into(),
        ..ExecutorRequest::at(Operation::FileCopy, "alias")
    };
    assert_eq!(sandbox.code(copy).await, denied);
    let grep = ExecutorRequest {
        pattern: "SECRET".into(),
        ..ExecutorRequest::new(Operation::FileGrep)
    };
    assert!(sandbox.call(grep).await.unwrap().matches.is_empty());
    // Removing the name inside the workspace only unlinks that name.
    sandbox
        .call(ExecutorRequest::at(Operation::FileRemove, "alias"))
        .await
        .unwrap();
    sandbox.secret_untouched();
}

#[tokio::test]
async fn fifos_and_devices_are_never_opened_for_content() {
    use rustix::fs::{CWD, FileType, Mode, makedev, mknodat};
    let sandbox = Sandbox::new();
    let fifo = sandbox.root.join("pipe");
    mknodat(CWD, &fifo, FileType::Fifo, Mode::from(0o644), 0).unwrap();
    // A character device needs CAP_MKNOD: checked when the test runs with it.
    let null = sandbox.root.join("null");
    let device = mknodat(
        CWD,
        &null,
        FileType::CharacterDevice,
        Mode::from(0o666),
        makedev(1, 3),
    )
    .is_ok();
    let mut names = vec!["pipe"];
    if device {
        names.push("null");
    }
    for name in names {
        let read = ExecutorRequest::at(Operation::FileRead, name);
        assert_eq!(sandbox.code(read).await, ErrorCode::Internal, "{name}");
        let replace = ExecutorRequest {
            version: content_version(b""),
            ..with_data(Operation::FileReplace, name, b"x")
        };
        assert_eq!(sandbox.code(replace).await, ErrorCode::Internal, "{name}");
        let copy = ExecutorRequest {
            destination: format!("{name}.copy"),
            ..ExecutorRequest::at(Operation::FileCopy, name)
        };
        assert_eq!(sandbox.code(copy).await, ErrorCode::Internal, "{name}");
        let create = with_data(Operation::FileCreate, name, b"x");
        assert_eq!(sandbox.code(create).await, ErrorCode::AlreadyExists);
    }
    let grep = ExecutorRequest {
        pattern: "".into(),
        ..ExecutorRequest::new(Operation::FileGrep)
    };
    assert!(sandbox.call(grep).await.unwrap().matches.is_empty());
    let stat = ExecutorRequest::at(Operation::FileStat, "pipe");
    let info = sandbox.call(stat).await.unwrap().info.unwrap();
    assert_ne!(info.mode & MODE_NAMED_PIPE, 0);
}

#[tokio::test]
async fn very_long_paths_are_bounded_and_refused_without_effect() {
    let sandbox = Sandbox::new();
    let component = "d".repeat(200);
    let deep: Vec<&str> = std::iter::repeat_n(component.as_str(), 19).collect();
    let deep = format!("{}/f", deep.join("/"));
    assert!(deep.len() < MAX_PATH_BYTES);
    sandbox
        .call(with_data(Operation::FileCreate, &deep, b"deep"))
        .await
        .expect("a deep path under the bound works");
    let over = "x/".repeat(MAX_PATH_BYTES / 2) + "f";
    assert!(over.len() > MAX_PATH_BYTES);
    let create = with_data(Operation::FileCreate, &over, b"x");
    assert_eq!(sandbox.code(create).await, ErrorCode::ResourceExhausted);
    assert!(!sandbox.root.join("x").exists(), "nothing was created");
    let long_name = "n".repeat(256);
    let create = with_data(Operation::FileCreate, &long_name, b"x");
    assert_eq!(sandbox.code(create).await, ErrorCode::Internal);
    let climbing = format!("{}/../../../../outside/secret.txt", "a/".repeat(1000));
    let read = ExecutorRequest::at(Operation::FileRead, climbing);
    assert_eq!(sandbox.code(read).await, ErrorCode::NotFound);
    sandbox.secret_untouched();
}

#[tokio::test]
async fn names_that_are_not_utf8_are_listed_lossily_and_their_lossy_form_reaches_nothing() {
    let sandbox = Sandbox::new();
    let raw_name = OsStr::from_bytes(b"bad\xff.txt");
    std::fs::write(sandbox.root.join(raw_name), b"x").unwrap();
    let list = sandbox
        .call(ExecutorRequest::new(Operation::FileList))
        .await
        .unwrap();
    let names: Vec<&str> = list.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["bad\u{fffd}.txt"]);
    let read = ExecutorRequest::at(Operation::FileRead, "bad\u{fffd}.txt");
    assert_eq!(sandbox.code(read).await, ErrorCode::NotFound);
    let glob = ExecutorRequest {
        pattern: "*".into(),
        ..ExecutorRequest::new(Operation::FileGlob)
    };
    assert_eq!(sandbox.call(glob).await.unwrap().paths, ["bad\u{fffd}.txt"]);
}

#[test]
fn a_request_whose_path_is_not_utf8_is_invalid_argument() {
    use std::io::Write as _;
    let sandbox = Sandbox::new();
    let mut helper = std::process::Command::new(env!("CARGO_BIN_EXE_execution-helper"))
        .arg("--workspace")
        .arg(&sandbox.root)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let frame = b"{\"operation\":\"file.read\",\"path\":\"bad\xff\"}";
    helper.stdin.take().unwrap().write_all(frame).unwrap();
    let output = helper.wait_with_output().unwrap();
    assert!(output.status.success());
    let envelope =
        execution_provider::executor::transport::decode_envelope(&output.stdout).unwrap();
    let error = envelope.error.expect("refused");
    assert_eq!(error.code, ErrorCode::InvalidArgument);
}

#[path = "../fuzz/checks/replay.rs"]
mod fuzz_replay;
#[path = "../fuzz/checks/helper_path_resolve.rs"]
mod helper_path_resolve;
#[path = "../fuzz/checks/helper_request_decode.rs"]
mod helper_request_decode;

/// Every input in `fuzz/regressions/helper_request_decode/` passes the fuzz target's own check.
#[test]
fn the_helper_request_decode_fuzz_regressions_pass_the_fuzz_check() {
    fuzz_replay::replay("helper_request_decode", helper_request_decode::check);
}

/// Every input in `fuzz/regressions/helper_path_resolve/` passes the fuzz target's own check.
#[test]
fn the_helper_path_resolve_fuzz_regressions_pass_the_fuzz_check() {
    fuzz_replay::replay("helper_path_resolve", helper_path_resolve::check);
    std::fs::remove_dir_all(helper_path_resolve::workspace_base())
        .expect("the workspace is removed");
}
