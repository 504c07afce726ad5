//! The figures under load: the concurrency sweep (1 to 64 concurrent `StartCommand("true")`
//! over up to four client identities, each on its own environment and claim) and the scale
//! run (environments filled by eight concurrent clients up to each size, then resident
//! memory with 100 environments active, `StartCommand` and claim latency at that size).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use execution_provider::api::pb;

use crate::calls::{self, Client, Samples, ms};
use crate::dev::{self, Dev, Scrape};

/// One identity's environment and held claim.
pub struct Claimed {
    /// The identity's client.
    pub client: Client,
    /// The claim's data-plane context.
    pub context: pb::RequestContext,
}

/// One level of the sweep.
pub struct SweepPoint {
    /// Concurrent calls.
    pub concurrency: usize,
    /// Identities they were spread over.
    pub identities: usize,
    /// Calls per second.
    pub throughput: f64,
    /// Latencies of the calls that succeeded.
    pub samples: Samples,
    /// Calls that failed.
    pub failed: usize,
}

/// `concurrency` tasks, task `t` on environment `t` (whose identity is `t % 4`), each calling
/// `StartCommand("true")` until `window` passed.
pub async fn sweep_level(claimed: &[Claimed], concurrency: usize, window: Duration) -> SweepPoint {
    let identities = concurrency.min(4);
    let began = Instant::now();
    let deadline = began + window;
    let mut tasks = Vec::new();
    for held in &claimed[..concurrency] {
        let mut client = held.client.clone();
        let context = held.context.clone();
        tasks.push(tokio::spawn(async move {
            let (mut samples, mut failed) = (Vec::new(), 0);
            while Instant::now() < deadline {
                let started = Instant::now();
                match calls::try_run(&mut client, &context, "true").await {
                    Ok(()) => samples.push(started.elapsed()),
                    Err(status) => {
                        failed += 1;
                        eprintln!(
                            "  sweep call failed: {:?} {}",
                            status.code(),
                            status.message()
                        );
                    }
                }
            }
            (samples, failed)
        }));
    }
    let (mut all, mut failed) = (Vec::new(), 0);
    for task in tasks {
        let (samples, failures) = task.await.expect("a sweep task");
        all.extend(samples);
        failed += failures;
    }
    let wall = began.elapsed();
    SweepPoint {
        concurrency,
        identities,
        throughput: all.len() as f64 / wall.as_secs_f64(),
        samples: Samples(all),
        failed,
    }
}

/// The figures at one size of the scale run.
pub struct ScalePoint {
    /// Environments in the provider.
    pub environments: usize,
    /// `EnsureTemplate` calls per second of the timed batch (8 concurrent clients, each a new
    /// environment).
    pub ensure_rate: f64,
    /// Their median latency.
    pub ensure_median: Duration,
    /// Environments filled (ensure + commit) per second before the timed batch.
    pub fill_rate: f64,
    /// How long the reconciler took after the fill until every environment was Ready.
    pub settle: Duration,
    /// `StartCommand("true")` with a held claim.
    pub start: Samples,
    /// Claim acquire + release.
    pub claim: Samples,
    /// The provider and every process it started, with the active environments.
    pub usage: dev::Usage,
    /// Sandboxes running (environments that ran a command within the idle exit).
    pub active: usize,
}

/// Concurrent clients of the fill.
pub const FILL_CLIENTS: usize = 8;

/// The binding of scale environment `i`, ensured by identity `i % identities`.
pub fn scale_binding(i: usize) -> String {
    format!("scale-{i:05}")
}

/// Ensures (and, with `commit`, commits) scale environments `range` from
/// [`FILL_CLIENTS`] concurrent clients: the wall time and each ensure's latency.
async fn ensure_range(
    clients: &[Client],
    template: &pb::TemplateSelector,
    range: std::ops::Range<usize>,
    commit: bool,
) -> (Duration, Samples) {
    let next = Arc::new(AtomicUsize::new(range.start));
    let began = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..FILL_CLIENTS {
        let (next, clients, template) = (next.clone(), clients.to_vec(), template.clone());
        let end = range.end;
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return samples;
                }
                let client = &mut clients[i % clients.len()].clone();
                let binding = scale_binding(i);
                let started = Instant::now();
                let allocation = calls::ensure(client, &template, &binding).await;
                samples.push(started.elapsed());
                if commit {
                    let env = allocation.environment.expect("an environment");
                    calls::commit(client, &binding, &env).await;
                }
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("a fill task"));
    }
    (began.elapsed(), Samples(all))
}

/// Commits scale environments `range` (after an ensure-only batch).
async fn commit_range(
    clients: &[Client],
    template: &pb::TemplateSelector,
    range: std::ops::Range<usize>,
) {
    for i in range {
        let client = &mut clients[i % clients.len()].clone();
        let binding = scale_binding(i);
        let env = calls::ensure(client, template, &binding)
            .await
            .environment
            .expect("an environment");
        calls::commit(client, &binding, &env).await;
    }
}

/// Environments the reconciler counts as ready, by the `environments` gauge.
fn ready_count(scrape: &Scrape) -> Option<f64> {
    let series = scrape.series("execution_provider_environments");
    let ready: Vec<f64> = series
        .iter()
        .filter(|(labels, _)| labels.to_ascii_lowercase().contains("\"ready\""))
        .map(|(_, v)| *v)
        .collect();
    (!ready.is_empty()).then(|| ready.iter().sum())
}

/// Waits until the reconciler counts at least `environments` ready (bounded): how long.
async fn settle(dev: &Dev, environments: usize) -> Duration {
    let began = Instant::now();
    let deadline = began + Duration::from_secs(1800);
    loop {
        let scrape = Scrape::take(dev.health).await;
        match ready_count(&scrape) {
            Some(ready) if ready >= environments as f64 => {
                eprintln!(
                    "  environments by phase: {:?}",
                    scrape.series("execution_provider_environments")
                );
                return began.elapsed();
            }
            None if began.elapsed() > Duration::from_secs(5) => {
                eprintln!(
                    "the environments gauge has no ready phase: {:?}",
                    scrape.series("execution_provider_environments")
                );
                return began.elapsed();
            }
            _ => {}
        }
        assert!(Instant::now() < deadline, "the environments never settled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Makes scale environments `0..count` active: claim number `round`, one `true`, the claim
/// released (the sandbox stays up until its idle exit).
async fn activate(clients: &[Client], template: &pb::TemplateSelector, count: usize, round: usize) {
    for i in 0..count {
        let client = &mut clients[i % clients.len()].clone();
        let binding = scale_binding(i);
        calls::wait_ready(client, template, &binding).await;
        let env = calls::ensure(client, template, &binding)
            .await
            .environment
            .expect("an environment");
        let claim = calls::acquire(client, &binding, &env, round).await;
        calls::run(client, &calls::context(&binding, &claim), "true").await;
        calls::release(client, &binding, &claim, round).await;
    }
}

/// What the scale run needs.
pub struct ScaleRun<'a> {
    /// The provider.
    pub dev: &'a Dev,
    /// One client per identity.
    pub clients: Vec<Client>,
    /// The default template.
    pub template: pb::TemplateSelector,
    /// The probe environment: its binding and reference (ready, committed, identity 0).
    pub probe: (String, pb::EnvironmentRef),
    /// Environments that existed before the run (figures, sweep, probe).
    pub existing: usize,
    /// Ensures timed per size.
    pub measured: usize,
    /// Samples per latency series.
    pub samples: usize,
    /// Environments kept active.
    pub active: usize,
    /// Claims taken on the probe so far (their numbers must not repeat).
    pub probe_claims: usize,
    /// Scale environments made so far.
    pub scale_total: usize,
    /// Activation rounds so far (each takes claims of its own number).
    pub activations: usize,
}

impl ScaleRun<'_> {
    /// Grows the provider to `size` environments and measures there.
    pub async fn point(&mut self, size: usize) -> ScalePoint {
        let made = self.existing;
        let target = size.saturating_sub(made);
        let scale_so_far = self.scale_total;
        let timed = self
            .measured
            .min(target.saturating_sub(scale_so_far) / 2)
            .max(1);
        let fill_end = target - timed;
        let (fill_wall, _) =
            ensure_range(&self.clients, &self.template, scale_so_far..fill_end, true).await;
        let fill_rate = (fill_end - scale_so_far) as f64 / fill_wall.as_secs_f64().max(1e-9);
        let (wall, ensures) =
            ensure_range(&self.clients, &self.template, fill_end..target, false).await;
        commit_range(&self.clients, &self.template, fill_end..target).await;
        self.scale_total = target;
        let settled = settle(self.dev, size).await;
        self.activations += 1;
        let active = self.active.min(target);
        activate(&self.clients, &self.template, active, self.activations).await;
        let usage = dev::usage(self.dev.pid);
        let (start, claim) = self.probe_latencies().await;
        eprintln!(
            "  {size} environments: ensure {:.1}/s, StartCommand median {:.2} ms",
            timed as f64 / wall.as_secs_f64(),
            ms(start.median())
        );
        ScalePoint {
            environments: size,
            ensure_rate: timed as f64 / wall.as_secs_f64(),
            ensure_median: ensures.median(),
            fill_rate,
            settle: settled,
            start,
            claim,
            usage,
            active: crate::floors::sandbox_count(self.dev.pid),
        }
    }

    /// `StartCommand("true")` under a fresh claim on the probe, then claim pairs.
    async fn probe_latencies(&mut self) -> (Samples, Samples) {
        let (binding, env) = self.probe.clone();
        let client = &mut self.clients[0].clone();
        self.probe_claims += 1;
        let n = self.probe_claims;
        let claim = calls::acquire(client, &binding, &env, n).await;
        let context = calls::context(&binding, &claim);
        calls::run(client, &context, "true").await;
        let start = Samples::of(self.samples, |_| {
            let (mut client, context) = (client.clone(), context.clone());
            async move {
                calls::run(&mut client, &context, "true").await;
            }
        })
        .await;
        calls::release(client, &binding, &claim, n).await;
        let base = self.probe_claims;
        self.probe_claims += self.samples;
        let claim = Samples::of(self.samples, |i| {
            let (mut client, binding, env) = (client.clone(), binding.clone(), env.clone());
            async move {
                let claim = calls::acquire(&mut client, &binding, &env, base + 1 + i).await;
                calls::release(&mut client, &binding, &claim, base + 1 + i).await;
            }
        })
        .await;
        (start, claim)
    }
}
