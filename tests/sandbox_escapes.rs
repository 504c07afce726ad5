//! Escapes from a `dev` environment, each tried the way a hostile workload would: a shell
//! command run through the real provider (in-process `dev`, real mTLS, the real helper in its
//! sandbox). Every attempt must fail and leave the host as it was. The last test runs the same
//! probes with `--unsafe-no-isolation` and shows that each of them does detect the escape when
//! there is no sandbox, so none of the refusals above can pass vacuously.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::dev::{DevArgs, DevProvider};

/// The outcome of one shell command in the sandbox.
#[derive(Debug)]
struct Ran {
    state: i32,
    #[allow(dead_code)] // shown by the assertions' Debug output
    exit_code: i32,
    stdout: String,
    #[allow(dead_code)]
    stderr: String,
}

impl Ran {
    fn succeeded(&self) -> bool {
        self.state == pb::CommandState::Succeeded as i32
    }
}

/// A `dev` provider with one ready environment and a live claim on it.
struct Environment {
    tmp: tempfile::TempDir,
    dev: DevProvider,
    client: Client,
    binding: String,
    claim: pb::RunClaimResponse,
}

impl Environment {
    async fn start(isolated: bool) -> Environment {
        Self::start_in(tempfile::tempdir().unwrap(), isolated).await
    }

    /// An environment of a template with `network: outbound`.
    async fn start_outbound() -> Environment {
        let tmp = tempfile::tempdir().unwrap();
        init_state_dir_with_outbound_network(tmp.path());
        Self::start_in(tmp, true).await
    }

    async fn start_in(tmp: tempfile::TempDir, isolated: bool) -> Environment {
        Self::start_with(tmp, isolated, helper_binary()).await
    }

    /// [`Environment::start_in`] with the helper binary at `helper`.
    async fn start_with(
        tmp: tempfile::TempDir,
        isolated: bool,
        helper: std::path::PathBuf,
    ) -> Environment {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let args = DevArgs {
            state_dir: tmp.path().to_owned(),
            listen: "127.0.0.1:0".parse().unwrap(),
            kube_listen: "127.0.0.1:0".parse().unwrap(),
            health_listen: "127.0.0.1:0".parse().unwrap(),
            helper: Some(helper),
            limits: Default::default(),
            connections: Default::default(),
            unsafe_no_isolation: !isolated,
            telemetry: Default::default(),
        };
        let dev = execution_provider::cli::dev::start(&args)
            .await
            .expect("dev starts");
        let client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
        let mut environment = Environment {
            tmp,
            dev,
            client,
            binding: String::new(),
            claim: pb::RunClaimResponse::default(),
        };
        environment.claim = environment.claim_environment("escape").await;
        environment.binding = "escape".into();
        environment
    }

    async fn claim_environment(&mut self, binding: &str) -> pb::RunClaimResponse {
        let allocation = ensure_ready(&mut self.client, binding).await;
        acquire(
            &mut self.client,
            binding,
            allocation.environment.as_ref().unwrap(),
        )
        .await
    }

    fn state_dir(&self) -> &Path {
        self.tmp.path()
    }

    async fn run(&self, command: &str) -> Ran {
        run_in(&self.client, &self.binding, &self.claim, command).await
    }

    /// The host directory of this environment's workspace.
    fn workspace_on_host(&self) -> std::path::PathBuf {
        let id = &self.claim.environment.as_ref().unwrap().id;
        self.state_dir().join("workspaces").join(id)
    }
}

async fn run_in(
    client: &Client,
    binding: &str,
    claim: &pb::RunClaimResponse,
    command: &str,
) -> Ran {
    let started = client
        .clone()
        .start_command(pb::CommandStartRequest {
            context: Some(context(binding, claim)),
            command: command.into(),
            timeout_millis: 30_000,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("{command}: {status}"))
        .into_inner();
    let result = started.result.expect("a foreground command has a result");
    Ran {
        state: result.state,
        exit_code: result.exit_code,
        stdout: String::from_utf8_lossy(&result.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&result.stderr).into_owned(),
    }
}

/// The host pid of the init of `environment_id`'s sandbox (its supervisor), found by its
/// command line (`--sandbox-stage init SPEC -- supervise …` with the workspace in SPEC) and
/// by being PID 1 of its PID namespace (a child between its fork and exec has the same
/// command line).
fn supervisor_pid(state_dir: &Path, environment_id: &str) -> Option<u32> {
    let workspace = format!(
        "{}\"",
        state_dir.join("workspaces").join(environment_id).display()
    );
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let is_init = args.get(1).is_some_and(|a| a == "--sandbox-stage")
                && args.get(2).is_some_and(|a| a == "init")
                && args.get(3).is_some_and(|a| a.contains(&workspace))
                && args.iter().any(|a| a == "supervise");
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let pid_one = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .is_some_and(|ids| ids.split_whitespace().last() == Some("1"));
            (is_init && pid_one).then_some(pid)
        })
}

/// The state directory's three private keys, relative to the workspace as `dev` lays it out.
const KEYS: [&str; 4] = [
    "../../pki/ca.key",
    "../../security/grant.key",
    "../../client/client.key",
    "../../kubeconfig",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_directory_keys_cannot_be_read_by_relative_or_host_path() {
    let env = Environment::start(true).await;
    for key in KEYS {
        let on_host = env.workspace_on_host().join(key);
        assert!(
            on_host.is_file(),
            "{} exists on the host",
            on_host.display()
        );
        for path in [key.to_owned(), on_host.display().to_string()] {
            let ran = env.run(&format!("cat '{path}'")).await;
            assert!(!ran.succeeded(), "{path} was read: {ran:?}");
            assert!(
                !ran.stdout.contains("PRIVATE KEY") && ran.stdout.is_empty(),
                "{path}: {ran:?}"
            );
        }
    }
    let ran = env
        .run("find / \\( -path /proc -o -path /usr \\) -prune -o \\( -name ca.key -o -name grant.key -o -name client.key -o -name kubeconfig \\) -print")
        .await;
    assert_eq!(ran.stdout, "", "no key file anywhere in view: {ran:?}");
    env.dev.stop().await.unwrap();
}

/// A helper binary under `/tmp` (a build directory there, an unpacked release) still reaches
/// the sandbox: a root provider's host stage hides the host's `/tmp` behind a tmpfs of its own,
/// so it opens the binary before that. (A CI run whose caches were under `/tmp` found it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_binary_under_tmp_reaches_the_sandbox() {
    let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    let helper = dir.path().join("execution-helper");
    std::fs::copy(helper_binary(), &helper).unwrap();
    let env = Environment::start_with(tempfile::tempdir().unwrap(), true, helper).await;
    let ran = env.run("echo inside").await;
    assert!(ran.succeeded(), "{ran:?}");
    assert_eq!(ran.stdout, "inside\n");
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_shows_only_the_sandbox_and_the_workspace_is_at_slash_workspace() {
    let env = Environment::start(true).await;
    let ran = env.run("ls -A /; pwd").await;
    assert!(ran.succeeded(), "{ran:?}");
    let mut lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.pop(), Some("/workspace"));
    let allowed = [
        ".execution-helper",
        "bin",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "sbin",
        "tmp",
        "usr",
        "workspace",
    ];
    for entry in &lines {
        assert!(allowed.contains(entry), "/{entry} is visible: {lines:?}");
    }
    for required in ["usr", "etc", "tmp", "workspace", "proc", "dev"] {
        assert!(
            lines.contains(&required),
            "/{required} is missing: {lines:?}"
        );
    }
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_directories_and_the_root_are_read_only_and_etc_secrets_are_masked() {
    let env = Environment::start(true).await;
    let passwd = std::fs::read("/etc/passwd").unwrap();
    for target in [
        "/etc/escape",
        "/usr/escape",
        "/bin/escape",
        "/escape",
        "/usr/lib/escape",
    ] {
        let ran = env.run(&format!("echo x > {target}")).await;
        assert!(!ran.succeeded(), "{target} was written: {ran:?}");
        assert!(!Path::new(target).exists());
    }
    let ran = env.run("echo x >> /etc/passwd").await;
    assert!(!ran.succeeded(), "{ran:?}");
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
    if Path::new("/etc/shadow").exists() {
        let ran = env.run("wc -c < /etc/shadow").await;
        assert_eq!(ran.stdout.trim(), "0", "/etc/shadow is masked: {ran:?}");
    }
    let ran = env
        .run("echo ok > /tmp/t && cat /tmp/t && echo ok > w && cat w")
        .await;
    assert_eq!(
        ran.stdout, "ok\nok\n",
        "/tmp and the workspace are writable: {ran:?}"
    );
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_environments_workspace_is_unreachable() {
    let mut env = Environment::start(true).await;
    let other = env.claim_environment("other").await;
    let wrote = run_in(
        &env.client,
        "other",
        &other,
        "echo other-secret > secret.txt",
    )
    .await;
    assert!(wrote.succeeded(), "{wrote:?}");
    let other_id = other.environment.as_ref().unwrap().id.clone();
    let on_host = env
        .state_dir()
        .join("workspaces")
        .join(&other_id)
        .join("secret.txt");
    assert_eq!(std::fs::read_to_string(&on_host).unwrap(), "other-secret\n");
    for path in [
        format!("../{other_id}/secret.txt"),
        format!("/workspace/../{other_id}/secret.txt"),
        on_host.display().to_string(),
    ] {
        let ran = env.run(&format!("cat '{path}'")).await;
        assert!(
            !ran.succeeded() && !ran.stdout.contains("other-secret"),
            "{path}: {ran:?}"
        );
    }
    let ran = env
        .run("find / -path /proc -prune -o -name secret.txt -print")
        .await;
    assert_eq!(
        ran.stdout, "",
        "the other workspace is nowhere in view: {ran:?}"
    );
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_ports_and_other_loopback_services_are_unreachable() {
    let env = Environment::start(true).await;
    let service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    service.set_nonblocking(true).unwrap();
    let ports = [
        env.dev.addr.port(),
        env.dev.kubectl.addr.port(),
        service.local_addr().unwrap().port(),
    ];
    for port in ports {
        let ran = env
            .run(&format!(
                "perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\", Timeout => 5) or die \"refused: $!\\n\"; print \"connected\\n\"'"
            ))
            .await;
        assert!(
            !ran.succeeded() && !ran.stdout.contains("connected"),
            "port {port}: {ran:?}"
        );
    }
    assert_eq!(
        service.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "nothing reached the loopback service"
    );
    let ran = env
        .run("cat /proc/net/dev | tail -n +3 | cut -d: -f1")
        .await;
    assert_eq!(
        ran.stdout.split_whitespace().collect::<Vec<_>>(),
        ["lo"],
        "{ran:?}"
    );
    env.dev.stop().await.unwrap();
}

/// A `perl` one-liner connecting to `127.0.0.1:port`: prints `connected` or dies `refused`.
fn connect_probe(port: u16) -> String {
    format!(
        "perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\", Timeout => 5) or die \"refused: $!\\n\"; print \"connected\\n\"'"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_network_reaches_host_services_but_never_the_provider_nor_binds() {
    let env = Environment::start_outbound().await;
    let service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = service.local_addr().unwrap().port();
    let ran = env.run(&connect_probe(port)).await;
    assert!(
        ran.succeeded() && ran.stdout.contains("connected"),
        "{ran:?}"
    );
    service.set_nonblocking(true).unwrap();
    service
        .accept()
        .expect("the workload reached the host service");
    let provider_ports = [
        env.dev.addr.port(),
        env.dev.kubectl.addr.port(),
        env.dev.health_addr.port(),
    ];
    for port in provider_ports {
        let ran = env.run(&connect_probe(port)).await;
        assert!(
            !ran.succeeded() && !ran.stdout.contains("connected"),
            "provider port {port}: {ran:?}"
        );
    }
    let ran = env
        .run("perl -MIO::Socket::INET -e 'IO::Socket::INET->new(LocalAddr => \"127.0.0.1:0\", Listen => 1) or die \"refused: $!\\n\"; print \"bound\\n\"'")
        .await;
    assert!(!ran.succeeded() && !ran.stdout.contains("bound"), "{ran:?}");
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_is_invisible_and_cannot_be_signalled_and_proc_shows_only_the_sandbox() {
    let env = Environment::start(true).await;
    let provider = std::process::id();
    let ran = env
        .run(&format!(
            "kill -0 {provider} && echo signalled; ls -d /proc/{provider} && echo visible; ls /proc | grep -c '^[0-9]'"
        ))
        .await;
    assert!(!ran.stdout.contains("signalled"), "{ran:?}");
    assert!(!ran.stdout.contains("visible"), "{ran:?}");
    let processes: usize = ran.stdout.lines().last().unwrap().trim().parse().unwrap();
    assert!(
        processes <= 6,
        "only the sandbox's processes are in /proc: {ran:?}"
    );
    let ran = env.run("cat /proc/1/cmdline | tr '\\0' ' '").await;
    assert!(
        ran.stdout.contains("--sandbox-stage init"),
        "PID 1 is the sandbox's init: {ran:?}"
    );
    let ran = env.run("kill -KILL 1; echo still-here").await;
    assert!(ran.stdout.contains("still-here"), "{ran:?}");
    let again = env.run("echo alive").await;
    assert_eq!(again.stdout, "alive\n", "the provider keeps serving");
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ptrace_of_another_process_is_refused() {
    let env = Environment::start(true).await;
    // PTRACE_ATTACH (16) and PTRACE_SEIZE (0x4206) on a sibling of the same uid.
    let ran = env
        .run(
            "sleep 30 & pid=$!; for request in 16 16902; do \
             perl -e '$r = syscall(101, $ARGV[0], $ARGV[1], 0, 0); print \"$r \", $!+0, \"\\n\"' $request $pid; \
             done; grep TracerPid /proc/$pid/status; kill $pid",
        )
        .await;
    assert!(ran.succeeded(), "{ran:?}");
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines[..2], ["-1 1", "-1 1"], "EPERM: {ran:?}");
    assert_eq!(lines[2].split_whitespace().nth(1), Some("0"), "{ran:?}");
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_flood_is_bounded_and_the_provider_keeps_serving() {
    let mut env = Environment::start(true).await;
    let bystander = env.claim_environment("bystander").await;
    let flood = run_in(
        &env.client,
        &env.binding,
        &env.claim,
        "perl -e 'my $n = 0; for (1 .. 3000) { my $p = fork; next unless defined $p; \
         if ($p == 0) { sleep 20; exit } $n++ } opendir(my $d, \"/proc\"); \
         my $seen = grep { /^[0-9]+$/ } readdir($d); print \"$n $seen\"'",
    );
    let serving = async {
        // While the flood runs, another environment's command and a catalogue read are served.
        let started = tokio::time::Instant::now();
        let ran = run_in(&env.client, "bystander", &bystander, "echo served").await;
        let listed = env
            .client
            .clone()
            .list_execution_templates(pb::ListExecutionTemplatesRequest {})
            .await;
        (ran, listed.is_ok(), started.elapsed())
    };
    let (flood, (bystander_ran, listed, took)) = tokio::join!(flood, serving);
    assert_eq!(bystander_ran.stdout, "served\n", "{bystander_ran:?}");
    assert!(listed);
    assert!(took < Duration::from_secs(20), "served in {took:?}");
    let counts: Vec<u32> = flood
        .stdout
        .split_whitespace()
        .map(|n| n.parse().unwrap_or_else(|_| panic!("{flood:?}")))
        .collect();
    let [forked, processes] = counts[..] else {
        panic!("{flood:?}")
    };
    let bound = execution_provider::sandbox::Limits::default().pids;
    assert!(
        forked < 3000 && processes < bound,
        "{forked} forked, {processes} seen, bound {bound}"
    );
    assert!(forked > 100, "the flood did start processes: {forked}");
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_are_empty_and_no_new_privileges_is_set() {
    let env = Environment::start(true).await;
    let ran = env
        .run("grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status")
        .await;
    assert!(ran.succeeded(), "{ran:?}");
    let fields: Vec<(&str, &str)> = ran
        .stdout
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k, v.trim()))
        .collect();
    assert_eq!(fields.len(), 7, "{ran:?}");
    for (name, value) in fields {
        let expected = match name {
            "NoNewPrivs" => "1",
            "Seccomp" => "2",
            _ => "0000000000000000",
        };
        assert_eq!(value, expected, "{name}");
    }
    env.dev.stop().await.unwrap();
}

/// x86-64 numbers of system calls the seccomp filter refuses, with the arguments tried.
#[cfg(target_arch = "x86_64")]
const REFUSED: [(&str, u32, &str); 16] = [
    ("mount", 165, "0, 0, 0, 0, 0"),
    ("umount2", 166, "0, 0"),
    ("pivot_root", 155, "0, 0"),
    ("chroot", 161, "0"),
    ("unshare", 272, "0x10000000"),
    ("setns", 308, "0, 0"),
    ("ptrace", 101, "0, 0, 0, 0"),
    ("bpf", 321, "0, 0, 0"),
    ("perf_event_open", 298, "0, 0, 0, 0, 0"),
    ("keyctl", 250, "0, 0, 0, 0, 0"),
    ("kexec_load", 246, "0, 0, 0, 0"),
    ("init_module", 175, "0, 0, 0"),
    ("reboot", 169, "0, 0, 0, 0"),
    ("userfaultfd", 323, "0"),
    ("io_uring_setup", 425, "0, 0"),
    ("clone with CLONE_NEWUSER", 56, "0x10000000, 0, 0, 0, 0"),
];

#[cfg(target_arch = "x86_64")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_refuses_the_named_system_calls_with_eperm_and_clone3_with_enosys() {
    let env = Environment::start(true).await;
    let mut script = String::new();
    for (_, number, args) in REFUSED {
        script.push_str(&format!(
            "perl -e '$r = syscall({number}, {args}); print \"$r \", $!+0, \"\\n\"'; "
        ));
    }
    script.push_str("perl -e '$r = syscall(435, 0, 0); print \"$r \", $!+0, \"\\n\"'");
    let ran = env.run(&script).await;
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), REFUSED.len() + 1, "{ran:?}");
    for ((name, _, _), line) in REFUSED.iter().zip(&lines) {
        assert_eq!(*line, "-1 1", "{name} is refused with EPERM");
    }
    assert_eq!(lines[REFUSED.len()], "-1 38", "clone3 answers ENOSYS");
    let ran = env.run("unshare -U true || echo refused").await;
    assert!(ran.stdout.contains("refused"), "{ran:?}");
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_operations_run_in_the_sandbox_too() {
    let env = Environment::start(true).await;
    let mut client = env.client.clone();
    let created = client
        .files(pb::FileRequest {
            context: Some(context(&env.binding, &env.claim)),
            operation: pb::FileOperation::Create as i32,
            path: "made-by-a-file-operation.txt".into(),
            data: b"x".to_vec(),
            ..pb::FileRequest::default()
        })
        .await;
    assert!(created.is_ok(), "{created:?}");
    let ran = env.run("stat -c '%u' made-by-a-file-operation.txt").await;
    assert_eq!(ran.stdout, "0\n", "created by the sandbox's root: {ran:?}");
    use std::os::unix::fs::MetadataExt as _;
    let on_host =
        std::fs::metadata(env.workspace_on_host().join("made-by-a-file-operation.txt")).unwrap();
    let expected = if rustix::process::geteuid().is_root() {
        execution_provider::sandbox::ROOT_PROVIDER_SANDBOX_ID
    } else {
        rustix::process::geteuid().as_raw()
    };
    assert_eq!(
        on_host.uid(),
        expected,
        "owned on the host by the sandbox's id"
    );
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_isolation_every_probe_above_detects_the_escape() {
    let env = Environment::start(false).await;
    let ran = env.run(&format!("cat {}", KEYS[0])).await;
    assert!(
        ran.succeeded() && ran.stdout.contains("PRIVATE KEY"),
        "{ran:?}"
    );
    let ran = env.run("ls -A /").await;
    assert!(
        ran.stdout
            .lines()
            .any(|l| l == "root" || l == "home" || l == "var"),
        "{ran:?}"
    );
    let provider = std::process::id();
    let ran = env
        .run(&format!("kill -0 {provider} && echo signalled"))
        .await;
    assert!(ran.stdout.contains("signalled"), "{ran:?}");
    let ran = env.run("grep CapEff /proc/self/status").await;
    assert!(!ran.stdout.contains("0000000000000000"), "{ran:?}");
    let port = env.dev.addr.port();
    let ran = env
        .run(&format!(
            "perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\") or die; print \"connected\\n\"'"
        ))
        .await;
    assert!(ran.stdout.contains("connected"), "{ran:?}");
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_environment_is_one_sandbox_whose_init_is_its_supervisor() {
    let mut env = Environment::start(true).await;
    let ran = env
        .run("echo kept > /tmp/marker; tr '\\0' ' ' < /proc/1/cmdline; echo; ls -l /proc/$$/fd")
        .await;
    assert!(ran.succeeded(), "{ran:?}");
    let init = ran.stdout.lines().next().unwrap();
    assert!(
        init.contains("--sandbox-stage init") && init.contains(" supervise "),
        "PID 1 is the supervisor: {ran:?}"
    );
    assert!(
        !ran.stdout.contains("socket:"),
        "no socket reaches a command: {ran:?}"
    );
    let again = env.run("cat /tmp/marker").await;
    assert_eq!(
        again.stdout, "kept\n",
        "the next call is in the same sandbox"
    );
    let id = env.claim.environment.as_ref().unwrap().id.clone();
    let pid = supervisor_pid(env.state_dir(), &id).expect("the environment's supervisor runs");
    let other = env.claim_environment("other").await;
    let ran = run_in(&env.client, "other", &other, "cat /tmp/marker").await;
    assert!(
        !ran.succeeded(),
        "another environment has its own /tmp: {ran:?}"
    );
    let other_id = other.environment.as_ref().unwrap().id.clone();
    let other_pid = supervisor_pid(env.state_dir(), &other_id)
        .expect("the other environment's supervisor runs");
    assert_ne!(pid, other_pid);
    assert_eq!(
        supervisor_pid(env.state_dir(), &id),
        Some(pid),
        "the first one still runs"
    );
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_environments_supervisor_cannot_be_reached_signalled_or_ptraced() {
    let mut env = Environment::start(true).await;
    let other = env.claim_environment("other").await;
    let marked = run_in(&env.client, "other", &other, "echo mine > /tmp/marker").await;
    assert!(marked.succeeded(), "{marked:?}");
    let other_id = other.environment.as_ref().unwrap().id.clone();
    let pid = supervisor_pid(env.state_dir(), &other_id)
        .expect("the other environment's supervisor runs");
    let socket = env
        .state_dir()
        .join("supervisors")
        .join(format!("{other_id}.sock"));
    assert!(socket.exists(), "{} exists on the host", socket.display());
    let socket = socket.display();
    let script = format!(
        "kill -TERM {pid} && echo signalled; kill -KILL {pid} && echo signalled; \
         ls -d /proc/{pid} && echo visible; \
         perl -e '$r = syscall(101, 16, {pid}, 0, 0); print \"ptrace $r\\n\"'; \
         test -e '{socket}' && echo socket-visible; \
         perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Peer => \"{socket}\") and print \"connected\\n\"'; \
         ls /tmp"
    );
    let ran = env.run(&script).await;
    for escaped in ["signalled", "visible", "connected"] {
        assert!(!ran.stdout.contains(escaped), "{escaped}: {ran:?}");
    }
    assert!(ran.stdout.contains("ptrace -1"), "{ran:?}");
    assert!(!ran.stdout.contains("marker"), "{ran:?}");
    let still = run_in(&env.client, "other", &other, "cat /tmp/marker").await;
    assert_eq!(
        still.stdout, "mine\n",
        "the other sandbox lives on: {still:?}"
    );
    assert_eq!(supervisor_pid(env.state_dir(), &other_id), Some(pid));
    env.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_supervisor_secret_is_out_of_reach_and_the_init_outlives_its_own_commands_signals() {
    let env = Environment::start(true).await;
    let key = env.state_dir().join("security").join("supervisor.key");
    assert!(key.is_file(), "{} exists on the host", key.display());
    let marked = env.run("echo kept > /tmp/marker").await;
    assert!(marked.succeeded(), "{marked:?}");
    let script = format!(
        "cat ../../security/supervisor.key && echo read-key; cat '{}' && echo read-key; \
         cat /proc/1/environ && echo read-environ; \
         for fd in /proc/1/fd/*; do readlink $fd && echo read-fd; cat $fd && echo read-fd; done; \
         cat /proc/1/maps > /dev/null && echo read-maps; \
         perl -e 'open(my $m, \"<\", \"/proc/1/mem\") and print \"opened-mem\\n\"'; \
         kill -TERM 1; kill -INT 1; kill -HUP 1; kill -KILL 1; echo sent",
        key.display()
    );
    let ran = env.run(&script).await;
    assert!(ran.stdout.contains("sent"), "{ran:?}");
    for leaked in [
        "read-key",
        "read-environ",
        "read-fd",
        "read-maps",
        "opened-mem",
    ] {
        assert!(!ran.stdout.contains(leaked), "{leaked}: {ran:?}");
    }
    let id = env.claim.environment.as_ref().unwrap().id.clone();
    let pid = supervisor_pid(env.state_dir(), &id).expect("the supervisor runs");
    let again = env.run("cat /tmp/marker").await;
    assert_eq!(
        again.stdout, "kept\n",
        "the same sandbox still serves: {again:?}"
    );
    assert_eq!(supervisor_pid(env.state_dir(), &id), Some(pid));
    env.dev.stop().await.unwrap();
}
