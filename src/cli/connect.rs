//! How the command-line client reaches a provider: mTLS through the same runtime seams the
//! server uses, with the `dev` state directory's client configuration as the default.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use rustls::pki_types::ServerName;
use tonic::transport::{Channel, Endpoint};

use crate::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;
use crate::runtime::SystemClock;
use crate::runtime::net::TokioNet;
use crate::runtime::tls::{self, Identity, MtlsConnector};

/// Connection options shared by every client subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// The provider address.
    #[arg(long, default_value = "127.0.0.1:7443", env = "EXECUTION_PROVIDER_ADDRESS", value_parser = parse_address)]
    pub address: String,
    /// The `dev` state directory whose client configuration is the default.
    #[arg(
        long,
        default_value = ".execution-provider",
        env = "EXECUTION_PROVIDER_STATE_DIR"
    )]
    pub state_dir: PathBuf,
    /// CA bundle that signs the server certificate (default: <state-dir>/client/ca.pem).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Client certificate (default: <state-dir>/client/client.pem).
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// Client private key (default: <state-dir>/client/client.key).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Name expected in the server certificate (default: localhost).
    #[arg(long, default_value = "localhost")]
    pub server_name: String,
}

fn parse_address(text: &str) -> Result<String, String> {
    let valid = text
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if valid {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "`{text}` is not HOST:PORT, for example 127.0.0.1:7443"
        ))
    }
}

impl ConnectArgs {
    fn file(&self, explicit: &Option<PathBuf>, default: &str) -> PathBuf {
        explicit
            .clone()
            .unwrap_or_else(|| self.state_dir.join("client").join(default))
    }

    /// Connects to the provider.
    pub async fn connect(&self) -> anyhow::Result<ExecutionProviderServiceClient<Channel>> {
        let read = |path: PathBuf| {
            std::fs::read(&path).with_context(|| {
                format!(
                    "cannot read {}: start `execution-provider dev` first, or pass --ca/--cert/--key",
                    path.display()
                )
            })
        };
        let ca = read(self.file(&self.ca, "ca.pem"))?;
        let cert = read(self.file(&self.cert, "client.pem"))?;
        let key = read(self.file(&self.key, "client.key"))?;
        let identity = Identity::from_pem(&cert, &key, "client certificate")?;
        let cas = tls::certificates_from_pem(&ca, "CA bundle")?;
        let config = tls::client_config(Some(&identity), &cas, Arc::new(SystemClock))?;
        let name = ServerName::try_from(self.server_name.clone())
            .with_context(|| format!("`{}` is not a valid server name", self.server_name))?;
        let connector = MtlsConnector::new(TokioNet, config, Some(name));
        let channel = Endpoint::from_shared(format!("http://{}", self.address))?
            .connect_with_connector(connector)
            .await
            .with_context(|| format!("cannot connect to {}", self.address))?;
        Ok(ExecutionProviderServiceClient::new(channel)
            .max_decoding_message_size(crate::server::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::server::MAX_MESSAGE_BYTES))
    }
}
