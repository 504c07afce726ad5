//! The named scenarios: each sets the bounds its seeds draw fault probabilities from and the
//! mix of client actions. See sim/README.md for what each one exercises and what waits for
//! RPCs that are not built yet.

use std::fmt;
use std::str::FromStr;

/// Upper bounds of the per-seed fault probabilities.
#[derive(Debug, Clone, Copy, Default)]
pub struct Weights {
    /// Replica crashes per second.
    pub crash: f64,
    /// Partitions per second.
    pub partition: f64,
    /// Clock skew/drift/step intensity.
    pub clock: f64,
    /// API-server error rate.
    pub api: f64,
    /// Executor crash rate.
    pub executor: f64,
    /// Stale-claim reuse rate.
    pub stale: f64,
    /// Message latency intensity.
    pub latency: f64,
    /// Security manifest rotations and rollback attempts per second (replicas run the
    /// security manager only when this is above zero).
    pub security: f64,
}

/// The relative weight of each client action.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Ensure and commit a reference.
    pub ensure: u32,
    /// Acquire a run claim.
    pub acquire: u32,
    /// Renew the claim.
    pub renew: u32,
    /// File operations.
    pub files: u32,
    /// Commands.
    pub commands: u32,
    /// Release the claim.
    pub release: u32,
    /// Revoke the environment's grants (admin).
    pub revoke: u32,
    /// Lifecycle admin calls (replace, retire).
    pub lifecycle: u32,
    /// Release the binding's reference.
    pub release_reference: u32,
    /// Of the command actions, the percentage that start, look at or cancel a detached
    /// command instead of running a one-shot one.
    pub detached_percent: u32,
}

/// A named scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// No faults: the happy path end to end.
    Smoke,
    /// Replicas crash and restart while clients keep working.
    Failover,
    /// Clients reuse claims after others took newer epochs.
    StaleEpoch,
    /// Revocation races claims and dispatch.
    RevocationRace,
    /// Partitions between clients, replicas and the API server, then heal.
    PartitionHeal,
    /// Replica and executor crashes mid-operation.
    CrashRestart,
    /// Replace and retire during commands.
    LifecycleRace,
    /// Many clients allocate many environments at once.
    CapacityRace,
    /// Everything at once.
    Swarm,
}

impl Scenario {
    /// Every scenario, in order.
    pub const ALL: [Scenario; 9] = [
        Scenario::Smoke,
        Scenario::Failover,
        Scenario::StaleEpoch,
        Scenario::RevocationRace,
        Scenario::PartitionHeal,
        Scenario::CrashRestart,
        Scenario::LifecycleRace,
        Scenario::CapacityRace,
        Scenario::Swarm,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Smoke => "smoke",
            Scenario::Failover => "failover",
            Scenario::StaleEpoch => "stale-epoch",
            Scenario::RevocationRace => "revocation-race",
            Scenario::PartitionHeal => "partition-heal",
            Scenario::CrashRestart => "crash-restart",
            Scenario::LifecycleRace => "lifecycle-race",
            Scenario::CapacityRace => "capacity-race",
            Scenario::Swarm => "swarm",
        }
    }

    /// The fault bounds.
    pub fn weights(self) -> Weights {
        let calm = Weights {
            latency: 0.2,
            stale: 0.1,
            ..Weights::default()
        };
        match self {
            Scenario::Smoke => Weights { stale: 0.0, ..calm },
            Scenario::Failover => Weights { crash: 0.3, ..calm },
            Scenario::StaleEpoch => Weights {
                stale: 0.6,
                clock: 0.5,
                ..calm
            },
            Scenario::RevocationRace => Weights {
                stale: 0.3,
                security: 1.0,
                ..calm
            },
            Scenario::PartitionHeal => Weights {
                partition: 0.4,
                latency: 1.0,
                ..calm
            },
            Scenario::CrashRestart => Weights {
                crash: 0.3,
                executor: 0.3,
                ..calm
            },
            Scenario::LifecycleRace => Weights {
                executor: 0.1,
                ..calm
            },
            Scenario::CapacityRace => Weights { api: 0.1, ..calm },
            Scenario::Swarm => Weights {
                crash: 0.2,
                partition: 0.2,
                clock: 0.5,
                api: 0.1,
                executor: 0.2,
                stale: 0.4,
                latency: 1.0,
                security: 0.4,
            },
        }
    }

    /// The action mix of client hosts.
    pub fn mix(self) -> Mix {
        let base = Mix {
            ensure: 2,
            acquire: 4,
            renew: 2,
            files: 6,
            commands: 4,
            release: 3,
            revoke: 0,
            lifecycle: 0,
            release_reference: 0,
            detached_percent: 50,
        };
        match self {
            Scenario::RevocationRace => Mix { revoke: 4, ..base },
            // No detached commands: its canary needs every stale claim's command to reach
            // dispatch admission (with half of them detached, the canary survived 50 seeds).
            Scenario::StaleEpoch => Mix {
                acquire: 6,
                release: 6,
                files: 8,
                detached_percent: 0,
                ..base
            },
            Scenario::LifecycleRace => Mix {
                lifecycle: 5,
                release: 5,
                release_reference: 2,
                ..base
            },
            Scenario::CapacityRace => Mix {
                ensure: 10,
                release_reference: 2,
                ..base
            },
            Scenario::Swarm => Mix {
                revoke: 1,
                lifecycle: 1,
                release_reference: 1,
                ..base
            },
            _ => base,
        }
    }

    /// How many distinct bindings each client identity and owner spreads over (few means
    /// many clients collide on the same environments).
    pub fn bindings(self) -> u32 {
        match self {
            Scenario::CapacityRace => 12,
            Scenario::StaleEpoch | Scenario::RevocationRace => 1,
            _ => 2,
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scenario {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Scenario::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Scenario::ALL.iter().map(|s| s.name()).collect();
                format!("unknown scenario `{name}`; one of: {}", names.join(", "))
            })
    }
}
