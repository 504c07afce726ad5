//! Which network an environment's sandbox gets, chosen when its supervisor starts: the seam
//! between the local supervisors (which build sandboxes) and whoever knows the environment's
//! template (`dev`, from the template revision's `network` setting; docs/sandbox.md).

use super::transport::BoxFuture;
use crate::sandbox::Network;

/// Chooses the network of one environment's sandbox.
pub trait SandboxNetworks: Send + Sync {
    /// The network of `environment`'s next sandbox. Anything that cannot be established
    /// (the environment or its template unknown) gives [`Network::None`]: no network.
    fn network_of<'a>(&'a self, environment: &'a str) -> BoxFuture<'a, Network>;
}
