//! Benchmark: every figure of the provider against its physical floor, measured side by side
//! in one run on one machine and disk (issue 17 items 4 and 5, issue 13 item 5;
//! docs/performance.md). It starts the real `execution-provider dev` binary in a fresh state
//! directory, talks to it over mTLS as a stock gRPC client with four admitted identities,
//! and prints one table of figures, floors, ratios and goals:
//!
//! - P1: `StartCommand("true")` with a held claim against `sh -c true` spawned inside the
//!   environment's sandbox plus the durable writes one call makes (counted from the
//!   provider's own metrics), and against a bare `sh -c true`;
//! - a followed detached command's output latency (printed → received), and the Kubernetes
//!   writes that polling its status costs (none);
//! - P2: `Files` CREATE + READ of 4 MiB against a fsynced write + read of 4 MiB;
//! - ensure → commit → ready → acquire → first `echo`, and claim acquire + release;
//! - where the time of one `StartCommand` goes (RPC, executor, API requests by verb, CPU);
//! - a concurrency sweep: 1 to 64 concurrent calls over up to 4 identities;
//! - scale: environments filled to each size by 8 concurrent clients, with resident memory
//!   of the provider and everything it started (100 environments active), latencies at each
//!   size, ensure throughput, and `/ready` polled every 100 ms throughout.
//!
//! Run with `cargo bench --bench figures -- --quick` (about 30 s) or without
//! `--quick` for the full run (10,000 environments); `--sizes 100,2000` and `--no-scale`
//! change the scale part.

// A benchmark measures the host's wall time, which the runtime clock seam does not model.
#![allow(clippy::disallowed_methods)]

mod calls;
mod dev;
mod floors;
mod load;

use std::time::{Duration, Instant};

use execution_provider::api::pb;

use calls::{Client, Samples, ms};
use dev::{Dev, ReadyWatch, Scrape};
use load::{Claimed, ScalePoint, ScaleRun, SweepPoint};

/// The largest level of the concurrency sweep.
const SWEEP_MAX: usize = 64;

/// What one run measures.
struct Options {
    quick: bool,
    samples: usize,
    setups: usize,
    files: usize,
    window: Duration,
    sizes: Vec<usize>,
    measured: usize,
    active: usize,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut options = Options {
        quick,
        samples: if quick { 30 } else { 100 },
        setups: if quick { 3 } else { 10 },
        files: if quick { 5 } else { 20 },
        window: Duration::from_secs(if quick { 2 } else { 5 }),
        sizes: if quick {
            vec![100, 1_000]
        } else {
            vec![100, 10_000]
        },
        measured: if quick { 100 } else { 400 },
        active: 100,
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--sizes" => {
                options.sizes = rest
                    .next()
                    .expect("--sizes N,N")
                    .split(',')
                    .map(|n| n.parse().expect("a size"))
                    .collect();
            }
            "--no-scale" => options.sizes.clear(),
            "--samples" => {
                options.samples = rest.next().expect("--samples N").parse().expect("count")
            }
            // `cargo bench` passes `--bench`; other harness flags do not apply.
            _ => {}
        }
    }
    options
}

/// One line of the summary table.
struct Row {
    figure: String,
    ours: String,
    floor: String,
    ratio: String,
    goal: String,
    verdict: &'static str,
}

fn row(
    figure: &str,
    ours: String,
    floor: String,
    ratio: String,
    goal: &str,
    met: Option<bool>,
) -> Row {
    Row {
        figure: figure.to_owned(),
        ours,
        floor,
        ratio,
        goal: goal.to_owned(),
        verdict: match met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "",
        },
    }
}

fn print_table(rows: &[Row]) {
    println!("| figure | ours | floor | ratio | goal | |\n|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.figure, r.ours, r.floor, r.ratio, r.goal, r.verdict
        );
    }
}

/// Where the time of one call goes, from the provider's metrics around a series of calls.
struct Breakdown {
    calls: f64,
    lines: Vec<String>,
    writes_per_call: f64,
}

/// The value of label `name` in a series' labels.
fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split(',')
        .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
        .map(|v| v.trim_end_matches('"'))
        .unwrap_or("")
}

/// Kubernetes API requests of the provider that are not reads, so far.
fn kube_writes(scrape: &Scrape) -> f64 {
    let name = "execution_provider_kube_api_request_duration_seconds_count";
    let reads: f64 = ["get", "list", "watch"]
        .iter()
        .map(|verb| scrape.sum(name, &[&format!("verb=\"{verb}\"")]))
        .sum();
    scrape.sum(name, &[]) - reads
}

fn breakdown(
    before: &Scrape,
    after: &Scrape,
    method: &str,
    operation: &str,
    cpu: (Duration, Duration),
) -> Breakdown {
    let delta = |name: &str, labels: &[&str]| after.sum(name, labels) - before.sum(name, labels);
    let m = format!("method=\"{method}\"");
    let calls = delta("execution_provider_rpc_duration_seconds_count", &[&m]).max(1.0);
    let per = |v: f64| v / calls;
    let mut lines = vec![format!(
        "RPC in the provider (after TLS and HTTP/2 decoding), mean: {:.2} ms",
        per(delta("execution_provider_rpc_duration_seconds_sum", &[&m])) * 1e3
    )];
    let o = format!("operation=\"{operation}\"");
    lines.push(format!(
        "  executor call `{operation}` (supervisor, helper, command): {:.2} ms ({:.2} per call)",
        per(delta(
            "execution_provider_executor_call_duration_seconds_sum",
            &[&o]
        )) * 1e3,
        per(delta(
            "execution_provider_executor_call_duration_seconds_count",
            &[&o]
        )),
    ));
    let mut requests: Vec<(String, String)> = after
        .series("execution_provider_kube_api_request_duration_seconds_count")
        .iter()
        .map(|(labels, _)| {
            (
                label(labels, "verb").to_owned(),
                label(labels, "resource").to_owned(),
            )
        })
        .collect();
    requests.sort();
    requests.dedup();
    let mut writes = 0.0;
    for (verb, resource) in requests {
        let selector = [
            format!("verb=\"{verb}\""),
            format!("resource=\"{resource}\""),
        ];
        let selector = [selector[0].as_str(), selector[1].as_str()];
        let count = per(delta(
            "execution_provider_kube_api_request_duration_seconds_count",
            &selector,
        ));
        if count < 0.005 {
            continue;
        }
        if !matches!(verb.as_str(), "get" | "list" | "watch") {
            writes += count;
        }
        lines.push(format!(
            "  API server `{verb} {resource}`: {count:.2} per call, {:.2} ms per call",
            per(delta(
                "execution_provider_kube_api_request_duration_seconds_sum",
                &selector
            )) * 1e3
        ));
    }
    lines.push(format!(
        "CPU per call: provider and its processes {:.2} ms, this client {:.2} ms",
        ms(cpu.0) / calls,
        ms(cpu.1) / calls
    ));
    Breakdown {
        calls,
        lines,
        writes_per_call: writes,
    }
}

/// A ready environment of `binding` and a claim on it.
async fn claimed(client: &mut Client, template: &pb::TemplateSelector, binding: &str) -> Claimed {
    let env = calls::ready_environment(client, template, binding).await;
    let claim = calls::acquire(client, binding, &env, 1).await;
    let context = calls::context(binding, &claim);
    // The first call starts the environment's sandbox; the sweep times warm ones.
    calls::run(client, &context, "true").await;
    Claimed {
        client: client.clone(),
        context,
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{} CPUs ({cpu}), Linux {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel.trim()
    )
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn stat_line(name: &str, s: &Samples) {
    println!(
        "{name:<52} n={:<4} median {:>8.2} ms  p90 {:>8.2} ms  p99 {:>8.2} ms",
        s.0.len(),
        ms(s.median()),
        ms(s.quantile(0.9)),
        ms(s.quantile(0.99))
    );
}

/// The 4 MiB payload of P2 (not all one byte, so nothing below may shortcut it).
fn payload() -> Vec<u8> {
    (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let options = options();
    let began = Instant::now();
    println!("machine: {}", machine());
    println!("load average at start: {}", load_average());
    let tmp = tempfile::tempdir().expect("tempdir");
    let state = tmp.path().join("state");
    let largest = options.sizes.iter().copied().max().unwrap_or(0);
    // Every environment of the run counts towards the largest size; templates allow 10,000.
    let dev = Dev::start(&state, largest.clamp(200, 10_000)).await;
    // Readiness counts from the first ready answer: a starting provider is not ready yet.
    dev::wait_ready(dev.health, Duration::from_secs(120)).await;
    let watch = ReadyWatch::start(dev.health);
    let mut clients: Vec<Client> = dev
        .identities
        .iter()
        .map(|i| calls::client(dev.addr, &state, i))
        .collect();
    let client = &mut clients[0].clone();
    let template = calls::template(client).await;
    let mut rows = Vec::new();
    let mut environments = 0;

    // Ensure → commit → ready → acquire → first echo, each a new environment.
    let setup = Samples::of(options.setups, |i| {
        let (mut client, template) = (client.clone(), template.clone());
        async move {
            let binding = format!("setup-{i}");
            let env = calls::ready_environment(&mut client, &template, &binding).await;
            let claim = calls::acquire(&mut client, &binding, &env, 1).await;
            let out = calls::run(&mut client, &calls::context(&binding, &claim), "echo hi").await;
            assert_eq!(out, b"hi\n");
        }
    })
    .await;
    environments += options.setups;
    stat_line("ensure → commit → ready → acquire → first echo", &setup);
    rows.push(row(
        "ensure → commit → ready → acquire → first `echo`, median",
        format!("{:.1} ms", ms(setup.median())),
        "—".into(),
        "—".into(),
        "≤ 50 ms",
        Some(setup.median() <= Duration::from_millis(50)),
    ));

    // Claim acquire + release.
    let claims_env = calls::ready_environment(client, &template, "claims").await;
    environments += 1;
    let pairs = Samples::of(options.samples, |i| {
        let (mut client, env) = (client.clone(), claims_env.clone());
        async move {
            let claim = calls::acquire(&mut client, "claims", &env, i).await;
            calls::release(&mut client, "claims", &claim, i).await;
        }
    })
    .await;
    stat_line("claim acquire + release", &pairs);
    rows.push(row(
        "acquire + release of a claim, median",
        format!("{:.2} ms", ms(pairs.median())),
        "—".into(),
        "—".into(),
        "—",
        None,
    ));

    // P1: StartCommand("true") with a held claim, the provider's metrics around it.
    let p1_env = calls::ready_environment(client, &template, "p1").await;
    environments += 1;
    let claim = calls::acquire(client, "p1", &p1_env, 1).await;
    let context = calls::context("p1", &claim);
    let first = Samples::of(1, |_| {
        let (mut client, context) = (client.clone(), context.clone());
        async move {
            calls::run(&mut client, &context, "true").await;
        }
    })
    .await;
    stat_line("StartCommand(true), first call of the environment", &first);
    let before = Scrape::take(dev.health).await;
    let cpu_before = (dev::usage(dev.pid).cpu, dev::own_cpu());
    let p1 = Samples::of(options.samples, |_| {
        let (mut client, context) = (client.clone(), context.clone());
        async move {
            calls::run(&mut client, &context, "true").await;
        }
    })
    .await;
    let cpu = (
        dev::usage(dev.pid).cpu - cpu_before.0,
        dev::own_cpu() - cpu_before.1,
    );
    let after = Scrape::take(dev.health).await;
    stat_line("StartCommand(true), held claim", &p1);
    let spent = breakdown(&before, &after, "StartCommand", "command.start", cpu);

    // P1's floors, raw, on the same machine and disk.
    let floor_dir = state.join("floors");
    std::fs::create_dir_all(&floor_dir).expect("floor directory");
    let bare = floors::bare_spawn(options.samples);
    stat_line("floor: bare `sh -c true` spawn", &bare);
    let init = floors::sandbox_init(dev.pid, &p1_env.id);
    let inside = match init.map(|pid| floors::sandbox_spawn(pid, options.samples)) {
        Some(Ok(samples)) => Some(samples),
        Some(Err(e)) => {
            eprintln!("cannot spawn inside the sandbox: {e}");
            None
        }
        None => {
            eprintln!("the sandbox init of {} was not found", p1_env.id);
            None
        }
    };
    if let Some(inside) = &inside {
        stat_line(
            "floor: `sh -c true` inside the environment's sandbox",
            inside,
        );
    }
    let append = floors::durable_page_write(&floor_dir, options.samples);
    stat_line("floor: one durable 4 KiB page write (fdatasync)", &append);
    let spawn_floor = inside.as_ref().unwrap_or(&bare).median();
    let floor = spawn_floor + append.median().mul_f64(spent.writes_per_call);
    println!(
        "P1 floor: {} spawn {:.2} ms + {:.2} durable writes × {:.2} ms = {:.2} ms",
        if inside.is_some() {
            "in-sandbox"
        } else {
            "bare (in-sandbox unavailable)"
        },
        ms(spawn_floor),
        spent.writes_per_call,
        ms(append.median()),
        ms(floor)
    );
    println!(
        "where one StartCommand(\"true\") goes ({} calls, provider metrics; client-side mean {:.2} ms):",
        spent.calls,
        ms(p1.0.iter().sum::<Duration>()) / p1.0.len().max(1) as f64
    );
    for line in &spent.lines {
        println!("  {line}");
    }
    let p1_ratio = p1.median().as_secs_f64() / floor.as_secs_f64();
    rows.push(row(
        "P1 `StartCommand(\"true\")`, median",
        format!("{:.2} ms", ms(p1.median())),
        format!(
            "{:.2} ms (spawn in sandbox + {:.1} fsynced writes)",
            ms(floor),
            spent.writes_per_call
        ),
        format!("{p1_ratio:.1}×"),
        "≤ 2×",
        Some(p1_ratio <= 2.0),
    ));
    rows.push(row(
        "P1 against a bare spawn",
        format!("{:.2} ms", ms(p1.median())),
        format!("{:.2} ms (bare `sh -c true`)", ms(bare.median())),
        format!(
            "{:.1}×",
            p1.median().as_secs_f64() / bare.median().as_secs_f64()
        ),
        "reported",
        None,
    ));

    // A followed command's output latency, and what polling its status costs.
    let lines = if options.quick { 30 } else { 100 };
    let (streamed, streamed_id) = calls::output_latency(client, &context, lines).await;
    stat_line("followed output: printed → received", &streamed);
    rows.push(row(
        "a followed command's output, printed → received by the client, p99",
        format!(
            "{:.2} ms (median {:.2} ms)",
            ms(streamed.quantile(0.99)),
            ms(streamed.median())
        ),
        "—".into(),
        "—".into(),
        "≤ 50 ms",
        Some(streamed.quantile(0.99) <= Duration::from_millis(50)),
    ));
    let polls = 100;
    let before = Scrape::take(dev.health).await;
    calls::poll_status(client, &context, &streamed_id, polls).await;
    let after = Scrape::take(dev.health).await;
    let writes = kube_writes(&after) - kube_writes(&before);
    rows.push(row(
        &format!("Kubernetes writes during {polls} `CommandStatus` polls"),
        format!("{writes:.0}"),
        "—".into(),
        "—".into(),
        "0",
        Some(writes == 0.0),
    ));

    // P2: Files CREATE + READ of 4 MiB against a fsynced write + read.
    let data = payload();
    let p2 = Samples::of(options.files, |i| {
        let (mut client, context, data) = (client.clone(), context.clone(), data.clone());
        async move {
            let path = format!("p2-{i}.bin");
            calls::file(
                &mut client,
                &context,
                pb::FileOperation::Create,
                &path,
                data,
            )
            .await;
            let back = calls::file(
                &mut client,
                &context,
                pb::FileOperation::Read,
                &path,
                Vec::new(),
            )
            .await;
            assert_eq!(back.data.len(), 4 << 20);
        }
    })
    .await;
    stat_line("P2 Files CREATE + READ 4 MiB", &p2);
    let p2_floor = floors::durable_file_round_trip(&floor_dir, &data, options.files);
    stat_line("floor: fsynced write + read of 4 MiB", &p2_floor);
    let p2_ratio = p2_floor.median().as_secs_f64() / p2.median().as_secs_f64();
    rows.push(row(
        "P2 `Files` CREATE + READ of 4 MiB, median",
        format!("{:.1} ms", ms(p2.median())),
        format!("{:.1} ms (fsynced write + read)", ms(p2_floor.median())),
        format!("{p2_ratio:.2}× throughput"),
        "≥ 0.5×",
        Some(p2_ratio >= 0.5),
    ));
    calls::release(client, "p1", &claim, 1).await;

    // The concurrency sweep.
    // One environment per concurrent call (one call at a time runs in an environment: a
    // second one meanwhile is refused with a conflict), environment k of identity k % 4.
    let mut claimed_all = Vec::new();
    for k in 0..SWEEP_MAX {
        let c = &mut clients[k % dev.identities.len()];
        claimed_all.push(claimed(c, &template, &format!("sweep-{k}")).await);
    }
    environments += SWEEP_MAX;
    let mut sweep: Vec<SweepPoint> = Vec::new();
    for concurrency in [1, 2, 4, 8, 16, 32, SWEEP_MAX] {
        let point = load::sweep_level(&claimed_all, concurrency, options.window).await;
        eprintln!("  sweep {concurrency}: {:.0} calls/s", point.throughput);
        sweep.push(point);
    }

    // Scale.
    let probe_env = calls::ready_environment(client, &template, "probe").await;
    environments += 1;
    let mut scale = ScaleRun {
        dev: &dev,
        clients: clients.clone(),
        template: template.clone(),
        probe: ("probe".to_owned(), probe_env),
        existing: environments,
        measured: options.measured,
        samples: options.samples,
        active: options.active,
        probe_claims: 0,
        scale_total: 0,
        activations: 0,
    };
    let mut points: Vec<ScalePoint> = Vec::new();
    for &size in &options.sizes {
        points.push(scale.point(size).await);
    }
    let (polls, lost) = watch.finish().await;
    let load_end = load_average();
    dev.stop().await;

    println!();
    println!(
        "concurrency sweep: StartCommand(\"true\"), each identity its own environment and claim, {} s per level",
        options.window.as_secs()
    );
    println!(
        "| concurrent calls | identities | calls/s | failed | p50 | p90 | p99 |\n|---|---|---|---|---|---|---|"
    );
    for p in &sweep {
        println!(
            "| {} | {} | {:.0} | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
            p.concurrency,
            p.identities,
            p.throughput,
            p.failed,
            ms(p.samples.median()),
            ms(p.samples.quantile(0.9)),
            ms(p.samples.quantile(0.99))
        );
    }
    if !points.is_empty() {
        println!();
        println!(
            "scale: fill by {} concurrent clients over {} identities; {} timed ensures per size",
            load::FILL_CLIENTS,
            clients.len(),
            options.measured
        );
        println!(
            "| environments | ensure/s (timed) | ensure p50 | fill (ensure+commit)/s | settled after | StartCommand p50 | claim p50 | active | processes | RSS summed | PSS summed | resident once | CPU so far |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for p in &points {
            println!(
                "| {} | {:.1} | {:.1} ms | {:.1} | {:.1} s | {:.2} ms | {:.2} ms | {} | {} | {:.0} MiB | {:.0} MiB | {} | {:.0} s |",
                p.environments,
                p.ensure_rate,
                ms(p.ensure_median),
                p.fill_rate,
                p.settle.as_secs_f64(),
                ms(p.start.median()),
                ms(p.claim.median()),
                p.active,
                p.usage.processes,
                p.usage.rss_kib as f64 / 1024.0,
                p.usage.pss_kib as f64 / 1024.0,
                p.usage.resident_kib.map_or("n/a".to_owned(), |k| format!(
                    "{:.0} MiB",
                    k as f64 / 1024.0
                )),
                p.usage.cpu.as_secs_f64()
            );
        }
        let (small, large) = (&points[0], &points[points.len() - 1]);
        // Summed RSS counts every shared page (the helper's text, shared libraries) once per
        // process that maps it. The goal is judged on the resident pages counted once each
        // (distinct page frames) where they can be read, and on PSS (each shared page divided
        // among its sharers, so the sum is close to it) where they cannot.
        let mib = |kib: u64| kib as f64 / 1024.0;
        let judged = small.usage.resident_kib.unwrap_or(small.usage.pss_kib);
        let measure = match small.usage.resident_kib {
            Some(_) => "resident memory, each page once",
            None => "memory (PSS; page frames unreadable)",
        };
        rows.push(row(
            &format!(
                "{measure}, of the provider and its {} processes, {} active",
                small.usage.processes, small.active
            ),
            format!("{:.0} MiB", mib(judged)),
            "—".into(),
            "—".into(),
            "≤ 300 MB",
            Some(judged * 1024 <= 300_000_000),
        ));
        if small.usage.resident_kib.is_some() {
            rows.push(row(
                "the same, PSS summed",
                format!("{:.0} MiB", mib(small.usage.pss_kib)),
                "—".into(),
                "—".into(),
                "reported",
                None,
            ));
        }
        rows.push(row(
            "the same, summed RSS (shared pages counted in every process)",
            format!("{:.0} MiB", mib(small.usage.rss_kib)),
            "—".into(),
            "—".into(),
            "reported",
            None,
        ));
        if points.len() > 1 {
            let start = large.start.median().as_secs_f64() / small.start.median().as_secs_f64();
            let claim = large.claim.median().as_secs_f64() / small.claim.median().as_secs_f64();
            let label = |what: &str| {
                format!(
                    "{what} at {} vs {} environments",
                    large.environments, small.environments
                )
            };
            rows.push(row(
                &label("StartCommand(\"true\")"),
                format!("{:.2} ms", ms(large.start.median())),
                format!("{:.2} ms", ms(small.start.median())),
                format!("{start:.2}×"),
                "≤ 1.2×",
                Some(start <= 1.2),
            ));
            rows.push(row(
                &label("acquire + release"),
                format!("{:.2} ms", ms(large.claim.median())),
                format!("{:.2} ms", ms(small.claim.median())),
                format!("{claim:.2}×"),
                "≤ 1.2×",
                Some(claim <= 1.2),
            ));
        }
        let slowest = points
            .iter()
            .map(|p| p.ensure_rate)
            .fold(f64::INFINITY, f64::min);
        rows.push(row(
            "ensure throughput, 8 concurrent clients (slowest size)",
            format!("{slowest:.1}/s"),
            "—".into(),
            "—".into(),
            "≥ 50/s",
            Some(slowest >= 50.0),
        ));
    }
    rows.push(row(
        "readiness lost during the run",
        format!("{lost} of {polls} polls of /ready"),
        "—".into(),
        "—".into(),
        "0",
        Some(lost == 0),
    ));
    rows.push(row(
        "ensures answered a retryable UNAVAILABLE, then retried",
        calls::ensure_retries().to_string(),
        "—".into(),
        "—".into(),
        "reported",
        None,
    ));
    println!();
    println!(
        "{} run, {:.0} s; load average at the end: {load_end}",
        if options.quick { "quick" } else { "full" },
        began.elapsed().as_secs_f64()
    );
    print_table(&rows);
}
