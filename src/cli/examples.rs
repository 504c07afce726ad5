//! The examples `--help` shows for every `client` command (`after_help`). Each is a command
//! line that parses (tests/client_help.rs parses every one), written against `dev`'s
//! defaults: the address 127.0.0.1:7443 and the state directory `.execution-provider`.

/// `client templates`.
pub const TEMPLATES: &str = "Example:\n  execution-provider client templates --json";
/// `client ensure`.
pub const ENSURE: &str =
    "Example:\n  execution-provider client ensure --binding my-agent --template default --wait 5m";
/// `client attach`.
pub const ATTACH: &str = "Examples (the environment; a command started with `exec --detach --stdin`):\n  \
execution-provider client attach --binding my-agent\n  \
execution-provider client attach --binding my-agent 5d41c0de";
/// `client run acquire`.
pub const RUN_ACQUIRE: &str =
    "Example:\n  execution-provider client run acquire --binding my-agent --ttl 2m --json";
/// `client run renew`.
pub const RUN_RENEW: &str = "Example (the values `run acquire --json` printed):\n  \
execution-provider client run renew --binding my-agent --run-id cli-1a2b --claim-id 9f3c --epoch 4 --generation 1 --ttl 2m";
/// `client run release`.
pub const RUN_RELEASE: &str = "Example (the values `run acquire --json` printed):\n  \
execution-provider client run release --binding my-agent --run-id cli-1a2b --claim-id 9f3c --epoch 4 --generation 1";
/// `client exec`.
pub const EXEC: &str = "Examples (output printed as it is produced; with a variable and a directory; in the \
background):\n  \
execution-provider client exec --binding my-agent --timeout 30s -- cargo test\n  \
execution-provider client exec --binding my-agent --env RUST_LOG=debug --workdir app -- cargo run\n  \
execution-provider client exec --binding my-agent --detach --ttl 5m -- python3 -m http.server 8000";
/// `client logs`.
pub const LOGS: &str = "Example (the id `exec --detach` printed):\n  \
execution-provider client logs --binding my-agent --follow --from 0 5d41c0de";
/// `client kill`.
pub const KILL: &str = "Examples (a proven cancel; a signal):\n  \
execution-provider client kill --binding my-agent 5d41c0de\n  \
execution-provider client kill --binding my-agent --signal INT 5d41c0de";
/// `client shell`.
pub const SHELL: &str = "Examples (`/bin/sh -i` on a terminal; another program):\n  \
execution-provider client shell --binding my-agent\n  \
execution-provider client shell --binding my-agent --ttl 5m -- bash -l";
/// `client ps`.
pub const PS: &str = "Example:\n  execution-provider client ps --binding my-agent";
/// `client file read`.
pub const FILE_READ: &str =
    "Example:\n  execution-provider client file read --binding my-agent notes/plan.md";
/// `client file write`.
pub const FILE_WRITE: &str = "Example:\n  execution-provider client file write --binding my-agent notes/plan.md --from plan.md";
/// `client file ls`.
pub const FILE_LS: &str = "Example:\n  execution-provider client file ls --binding my-agent notes";
/// `client release`.
pub const RELEASE: &str = "Example:\n  execution-provider client release --binding my-agent";
/// `client status`.
pub const STATUS: &str =
    "Example:\n  execution-provider client status --binding my-agent --binding reviewer";
/// `client describe`.
pub const DESCRIBE: &str = "Example:\n  execution-provider client describe --binding my-agent";
/// `client revoke`.
pub const REVOKE: &str = "Example:\n  \
execution-provider client revoke --env exec-4f2a --env-revision 1 --expected-generation 3 --op revoke-1";
/// `client refs list`.
pub const REFS_LIST: &str = "Example:\n  execution-provider client refs list --limit 10";
/// `client refs reserve`.
pub const REFS_RESERVE: &str = "Example:\n  \
execution-provider client refs reserve --env exec-4f2a --env-revision 1 --source my-agent --destination my-agent-2 --op reserve-1";
/// `client refs commit`.
pub const REFS_COMMIT: &str = "Example:\n  \
execution-provider client refs commit --env exec-4f2a --env-revision 1 --binding my-agent-2 --op reserve-1";
/// `client refs abort`.
pub const REFS_ABORT: &str = "Example:\n  \
execution-provider client refs abort --env exec-4f2a --env-revision 1 --binding my-agent-2 --op reserve-1";
/// `client refs prepare-delete`.
pub const REFS_PREPARE_DELETE: &str = "Example:\n  \
execution-provider client refs prepare-delete --env exec-4f2a --env-revision 1 --binding my-agent --op delete-1";
/// `client refs confirm-delete`.
pub const REFS_CONFIRM_DELETE: &str = "Example:\n  \
execution-provider client refs confirm-delete --env exec-4f2a --env-revision 1 --binding my-agent --op delete-1";
/// `client refs cancel-delete`.
pub const REFS_CANCEL_DELETE: &str = "Example:\n  \
execution-provider client refs cancel-delete --env exec-4f2a --env-revision 1 --binding my-agent --op delete-1";
/// `client admin retire`.
pub const ADMIN_RETIRE: &str = "Example (epoch and UIDs read from describe, then confirmed):\n  \
execution-provider client admin retire --env exec-4f2a --env-revision 1";
/// `client admin replace`.
pub const ADMIN_REPLACE: &str = "Example:\n  \
execution-provider client admin replace --env exec-4f2a --env-revision 1 --epoch 4 --pod-uid 7d1e --pvc-uid 0b9a --op replace-1 --yes";
/// `client admin recover`.
pub const ADMIN_RECOVER: &str = "Example (epoch and UIDs read from describe, then confirmed):\n  \
execution-provider client admin recover --env exec-4f2a --env-revision 1";
/// `client admin delete-retired`.
pub const ADMIN_DELETE_RETIRED: &str = "Example:\n  \
execution-provider client admin delete-retired --env exec-4f2a --env-revision 1 --pvc-uid 0b9a --op delete-env-1";
/// `client admin migrate`.
pub const ADMIN_MIGRATE: &str = "Example:\n  \
execution-provider client admin migrate --env exec-4f2a --env-revision 1 --from-schema 1 --pod-uid 7d1e --pvc-uid 0b9a --op migrate-1";
