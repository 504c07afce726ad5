//! The `dev` provider under measurement: the real `execution-provider dev` binary on
//! ephemeral ports in a fresh state directory (its template's limit raised and three more
//! client identities admitted), its health endpoints (`/ready`, `/metrics`) and the resident
//! memory and CPU time of it and every process it started.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use execution_provider::cli::pki::{DEV_CA_NAME, DevCa};
use execution_provider::cli::state_dir::StateDir;
use execution_provider::runtime::tls::Identity;
use execution_provider::templates::{ProfileSpec, canonical_template_revision};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};

/// Client identities admitted besides the dev client.
const EXTRA_CLIENTS: usize = 3;

/// A running `dev` provider.
pub struct Dev {
    child: Child,
    /// Its process id.
    pub pid: u32,
    /// The gRPC address (mTLS).
    pub addr: SocketAddr,
    /// The health listener (`/ready`, `/metrics`).
    pub health: SocketAddr,
    /// The state directory.
    pub state: PathBuf,
    /// The admitted client identities: the dev client first.
    pub identities: Vec<Identity>,
}

/// Initialises `state` as `dev` would, then admits [`EXTRA_CLIENTS`] more clients and raises
/// the default template's environment limit to `max_environments`.
fn prepare(state: &Path, max_environments: usize) -> Vec<Identity> {
    let dir = StateDir::open_or_init(state).expect("the state directory initialises");
    let manifest_path = dir.manifest_path();
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).expect("manifest")).expect("json");
    let first = manifest["clients"][0].clone();
    let client_dir = dir.client_dir();
    let read = |p: PathBuf| std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut identities = vec![
        Identity::from_pem(
            &read(client_dir.join("client.pem")),
            &read(client_dir.join("client.key")),
            "dev client",
        )
        .expect("the dev identity"),
    ];
    let ca_cert = String::from_utf8(read(dir.pki_dir().join("ca.pem"))).expect("pem");
    let ca_key = String::from_utf8(read(dir.pki_dir().join("ca.key"))).expect("pem");
    let ca = DevCa::load(DEV_CA_NAME, &ca_cert, &ca_key).expect("the dev CA");
    for n in 1..=EXTRA_CLIENTS {
        let uri = format!("spiffe://dev.local/ns/default/bench-{n}");
        let mut client = first.clone();
        client["uri"] = uri.clone().into();
        client["administrator"] = false.into();
        manifest["clients"]
            .as_array_mut()
            .expect("clients")
            .push(client);
        let leaf = ca.client(&uri).expect("a client certificate");
        identities.push(
            Identity::from_pem(leaf.cert.as_bytes(), leaf.key.as_bytes(), "bench client")
                .expect("identity"),
        );
    }
    std::fs::write(
        &manifest_path,
        serde_json::to_vec_pretty(&manifest).expect("json"),
    )
    .expect("manifest written");
    raise_environment_limit(&dir.templates_path(), max_environments);
    identities
}

/// Sets `maxEnvironments` of the default template's default revision (its key recomputed).
fn raise_environment_limit(path: &Path, max_environments: usize) {
    let text = std::fs::read_to_string(path).expect("templates");
    let mut file: serde_json::Value = serde_saphyr::from_str(&text).expect("yaml");
    let template = &mut file["templates"]["default"];
    let old = template["default"].as_str().expect("default").to_owned();
    let mut revision = template["revisions"][&old].take();
    revision["execution"]["maxEnvironments"] = max_environments.into();
    let profile: ProfileSpec =
        serde_json::from_value(revision["execution"].clone()).expect("profile");
    let key = canonical_template_revision(&profile.validate().expect("valid"));
    let revisions = template["revisions"].as_object_mut().expect("revisions");
    revisions.remove(&old);
    revisions.insert(key.clone(), revision);
    template["default"] = key.into();
    // JSON is YAML: the registry reads it back as written.
    std::fs::write(path, serde_json::to_vec_pretty(&file).expect("json")).expect("written");
}

/// Reads `lines` until one contains `marker`; returns what follows it up to `end`.
async fn wait_for_line<R: tokio::io::AsyncRead + Unpin>(
    lines: &mut tokio::io::Lines<BufReader<R>>,
    marker: &str,
    end: char,
) -> String {
    while let Some(line) = lines.next_line().await.expect("provider output") {
        if let Some((_, rest)) = line.split_once(marker) {
            return rest.split(end).next().unwrap_or_default().to_owned();
        }
    }
    panic!("the provider exited before printing `{marker}`");
}

/// Forwards the lines of a provider stream that report a failure; drops the rest.
fn drain<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    mut lines: tokio::io::Lines<BufReader<R>>,
) {
    tokio::spawn(async move {
        let mut warnings = 0;
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("ERROR") || line.contains("panicked") {
                eprintln!("provider: {line}");
            } else if line.contains("WARN") && warnings < 20 {
                warnings += 1;
                eprintln!("provider: {line}");
            }
        }
    });
}

impl Dev {
    /// Starts `execution-provider dev` in a fresh `state` with room for `max_environments`.
    pub async fn start(state: &Path, max_environments: usize) -> Dev {
        let identities = prepare(state, max_environments);
        let mut child = Command::new(env!("CARGO_BIN_EXE_execution-provider"))
            .arg("dev")
            .arg("--state-dir")
            .arg(state)
            .args(["--listen", "127.0.0.1:0", "--kube-listen", "127.0.0.1:0"])
            .args(["--health-listen", "127.0.0.1:0", "--helper"])
            .arg(env!("CARGO_BIN_EXE_execution-helper"))
            .env("EXECUTION_PROVIDER_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("execution-provider dev starts");
        let pid = child.id().expect("a pid");
        let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let started = async {
            let addr = wait_for_line(&mut out, "is listening on ", ' ').await;
            let health = wait_for_line(&mut err, "health and metrics on http://", '/').await;
            (addr, health)
        };
        let (addr, health) = tokio::time::timeout(Duration::from_secs(120), started)
            .await
            .expect("dev listens within 2 minutes");
        drain(out);
        drain(err);
        Dev {
            child,
            pid,
            addr: addr.parse().expect("an address"),
            health: health.parse().expect("an address"),
            state: state.to_owned(),
            identities,
        }
    }

    /// Stops the provider as Ctrl-C would, then ends any process it started that outlived it.
    pub async fn stop(mut self) {
        let started = descendants(self.pid);
        signal(self.pid, "-INT");
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            eprintln!("dev did not stop within 30 s of SIGINT; killing it");
            let _ = self.child.kill().await;
        }
        self.end_leftovers(started);
    }

    /// Kills those of `started` (processes of this provider) that still run on its state
    /// directory: a provider killed outright leaves its sandboxes behind until they idle out.
    fn end_leftovers(&self, started: Vec<u32>) {
        let state = self.state.to_string_lossy().into_owned();
        for pid in started {
            if cmdline(pid).is_some_and(|c| c.contains(&state)) {
                signal(pid, "-KILL");
            }
        }
    }
}

impl Drop for Dev {
    /// A run that panicked still leaves no process behind.
    fn drop(&mut self) {
        let started = descendants(self.pid);
        signal(self.pid, "-KILL");
        self.end_leftovers(started);
    }
}

fn signal(pid: u32, which: &str) {
    let _ = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// Polls `/ready` of `health` until it answers ready, for at most `deadline`.
pub async fn wait_ready(health: SocketAddr, deadline: Duration) {
    let until = tokio::time::Instant::now() + deadline;
    while !matches!(http_get(health, "/ready").await, Ok((200..=299, _))) {
        assert!(
            tokio::time::Instant::now() < until,
            "dev was not ready within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The command line of `pid`, its arguments joined by spaces.
pub fn cmdline(pid: u32) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&bytes).replace('\0', " "))
}

/// The fields of `/proc/PID/stat` after the command name and state: index 0 is the parent
/// (field 4), index `n - 4` field `n`.
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    Some(
        rest.split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// Every live descendant of `root`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Some(fields) = stat_fields(pid) {
            children.entry(fields[0] as u32).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            found.push(child);
            queue.push(child);
        }
    }
    found
}

/// What a process tree uses.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    /// Resident memory of all its live processes, summed (shared pages counted in each).
    pub rss_kib: u64,
    /// Their proportional set size: shared pages divided among the processes sharing them.
    pub pss_kib: u64,
    /// Their resident pages counted once each however many of them map it (by page frame
    /// number); `None` where `/proc/PID/pagemap` hides frame numbers (they need
    /// `CAP_SYS_ADMIN`).
    pub resident_kib: Option<u64>,
    /// CPU time (user + system) of all its processes, reaped children included.
    pub cpu: Duration,
    /// How many processes it has.
    pub processes: usize,
}

/// The value in KiB of the line `key` of `/proc/PID/<file>`.
fn kib(pid: u32, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Clock ticks of `/proc` (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// The usage of `root` and its descendants.
pub fn usage(root: u32) -> Usage {
    let all: Vec<u32> = std::iter::once(root).chain(descendants(root)).collect();
    let mut ticks = 0;
    for &pid in &all {
        if let Some(f) = stat_fields(pid) {
            // utime and stime are fields 14 and 15; cutime and cstime (reaped children) 16, 17.
            ticks += f[10] + f[11] + f[12] + f[13];
        }
    }
    Usage {
        rss_kib: all.iter().map(|&p| kib(p, "status", "VmRSS:")).sum(),
        pss_kib: all.iter().map(|&p| kib(p, "smaps_rollup", "Pss:")).sum(),
        resident_kib: resident_once(&all),
        cpu: Duration::from_secs_f64(ticks as f64 / TICKS),
        processes: all.len(),
    }
}

/// The resident memory of `pids` with every page counted once: the distinct page frames
/// their mappings have present. `None` when the frame numbers read as 0 (no `CAP_SYS_ADMIN`).
fn resident_once(pids: &[u32]) -> Option<u64> {
    use std::os::unix::fs::FileExt as _;
    const PAGE: u64 = 4096;
    const PRESENT: u64 = 1 << 63;
    const FRAME: u64 = (1 << 55) - 1;
    let mut frames = std::collections::BTreeSet::new();
    let mut present = 0u64;
    for &pid in pids {
        let (Ok(maps), Ok(pagemap)) = (
            std::fs::read_to_string(format!("/proc/{pid}/maps")),
            std::fs::File::open(format!("/proc/{pid}/pagemap")),
        ) else {
            continue; // the process ended meanwhile
        };
        for line in maps.lines() {
            let Some((start, end)) = line
                .split_whitespace()
                .next()
                .and_then(|range| range.split_once('-'))
                .and_then(|(a, b)| {
                    Some((
                        u64::from_str_radix(a, 16).ok()?,
                        u64::from_str_radix(b, 16).ok()?,
                    ))
                })
            else {
                continue;
            };
            let mut page = start / PAGE;
            while page < end / PAGE {
                let count = (end / PAGE - page).min(8192);
                let mut entries = vec![0u8; (count * 8) as usize];
                if pagemap.read_exact_at(&mut entries, page * 8).is_err() {
                    break; // [vsyscall] and the like
                }
                for entry in entries.chunks_exact(8) {
                    let entry = u64::from_le_bytes(entry.try_into().expect("8 bytes"));
                    if entry & PRESENT != 0 {
                        present += 1;
                        frames.insert(entry & FRAME);
                    }
                }
                page += count;
            }
        }
    }
    // Without the capability every present page reads as frame 0.
    (present == 0 || frames.len() > 1 || !frames.contains(&0))
        .then_some(frames.len() as u64 * PAGE / 1024)
}

/// The CPU time of this benchmark process (the clients).
pub fn own_cpu() -> Duration {
    let f = stat_fields(std::process::id()).expect("own stat");
    Duration::from_secs_f64((f[10] + f[11]) as f64 / TICKS)
}

/// `GET path` over plain HTTP/1 (the health listener closes after one answer): the status
/// code and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((code, body.to_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

/// One scrape of `/metrics`.
pub struct Scrape(String);

impl Scrape {
    /// Scrapes `health`.
    pub async fn take(health: SocketAddr) -> Scrape {
        let (code, body) = http_get(health, "/metrics")
            .await
            .expect("/metrics answers");
        assert_eq!(code, 200, "/metrics: {body}");
        Scrape(body)
    }

    /// The sum of the samples named `name` whose labels contain every one of `labels`.
    pub fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let sample = series.split('{').next()?;
                (sample == name && labels.iter().all(|want| series.contains(want)))
                    .then(|| value.parse::<f64>().ok())
                    .flatten()
            })
            .sum()
    }

    /// The samples of `name` as (labels, value).
    pub fn series(&self, name: &str) -> Vec<(String, f64)> {
        self.0
            .lines()
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let (sample, labels) = series.split_once('{')?;
                (sample == name).then(|| {
                    (
                        labels.trim_end_matches('}').to_owned(),
                        value.parse().unwrap_or(0.0),
                    )
                })
            })
            .collect()
    }
}

/// Polls `/ready` every 100 ms until stopped, counting answers that are not a success (the
/// endpoint answers 204 when ready).
pub struct ReadyWatch {
    stop: Arc<AtomicBool>,
    polls: Arc<AtomicU64>,
    lost: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyWatch {
    /// Starts polling `health`.
    pub fn start(health: SocketAddr) -> ReadyWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicU64::new(0));
        let lost = Arc::new(AtomicU64::new(0));
        let (s, p, l) = (stop.clone(), polls.clone(), lost.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                let answer = http_get(health, "/ready").await;
                p.fetch_add(1, Ordering::Relaxed);
                if !matches!(answer, Ok((200..=299, _))) && l.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("  /ready: {answer:?}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        ReadyWatch {
            stop,
            polls,
            lost,
            task,
        }
    }

    /// Stops polling: (polls, polls that were not ready).
    pub async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        (
            self.polls.load(Ordering::Relaxed),
            self.lost.load(Ordering::Relaxed),
        )
    }
}
