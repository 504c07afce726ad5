//! What the provider tells its operators besides metrics: log lines (text for people, JSON for
//! collectors), the audit line of every data-plane call ([`audit`]), Kubernetes Events on
//! environments ([`events`]), distributed traces exported over OTLP ([`traces`]), and the one
//! place that installs the process's `tracing` subscriber for `serve`, `dev` and the client.
//!
//! The log filter comes from `EXECUTION_PROVIDER_LOG` (an `EnvFilter` directive list); without
//! it, warnings and the audit lines ([`DEFAULT_FILTER`]). It filters the log lines only: the
//! trace layer, present only when traces are on, takes the spans of [`traces::TARGET`].

pub mod audit;
pub mod events;
pub mod traces;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;

/// The environment variable holding the log filter.
pub const LOG_FILTER_ENV: &str = "EXECUTION_PROVIDER_LOG";

/// The filter without [`LOG_FILTER_ENV`]: warnings, and every audit line.
pub const DEFAULT_FILTER: &str = "warn,execution_provider::audit=info";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, the event's fields
    /// (`message` among them) at the top level, and the current span.
    Json,
}

/// The telemetry flags of `serve` and `dev`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TelemetryArgs {
    /// How log lines are written to standard error: `text` or `json` (one object a line).
    #[arg(
        long,
        env = "EXECUTION_PROVIDER_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
    /// Export traces over OTLP/gRPC to this collector (`http://HOST:4317`, or `https://`).
    /// Without it, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`;
    /// without any of them traces are off.
    #[arg(long, env = "EXECUTION_PROVIDER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

/// The filter of [`LOG_FILTER_ENV`], else [`DEFAULT_FILTER`].
pub fn filter_from_env() -> EnvFilter {
    EnvFilter::try_from_env(LOG_FILTER_ENV).unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER))
}

/// The layer writing log lines in `format` to `writer`.
pub fn log_layer<S, W>(format: LogFormat, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(writer);
    match format {
        LogFormat::Text => layer.boxed(),
        LogFormat::Json => layer
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
    }
}

/// The subscriber of a process without traces: log lines passing `filter`, in `format`, to
/// `writer`.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    traced_subscriber(format, filter, writer, None)
}

/// [`subscriber`] that also exports spans through `traces` when given.
pub fn traced_subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    traces: Option<&traces::Traces>,
) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    // Both layers are filtered on their own: a layer without a filter (an absent `Option`
    // layer counts as one) would enable every span and event for itself.
    let traces_layer = match traces {
        Some(traces) => traces.layer(),
        None => tracing_subscriber::layer::Identity::new()
            .with_filter(tracing_subscriber::filter::LevelFilter::OFF)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(log_layer(format, writer).with_filter(filter))
        .with(traces_layer)
}

/// What [`install`] started: the trace exporter, when traces are on.
#[must_use = "shut it down to flush the traces"]
pub struct Telemetry {
    traces: Option<traces::Traces>,
}

impl Telemetry {
    /// Telemetry as `args` and the environment variables (read by `env`) ask for: the trace
    /// exporter is built only when a collector is named ([`traces::TraceSettings::resolve`]).
    /// Must be called inside a Tokio runtime.
    pub fn start(
        args: &TelemetryArgs,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let settings = traces::TraceSettings::resolve(args.otlp_endpoint.as_deref(), env)?;
        let traces = settings
            .map(|s| traces::Traces::start(&s, std::sync::Arc::new(crate::runtime::OsIds)))
            .transpose()?;
        Ok(Self { traces })
    }

    /// The trace pipeline, when traces are on.
    pub fn traces(&self) -> Option<&traces::Traces> {
        self.traces.as_ref()
    }

    /// Flushes and stops the trace exporter (at graceful shutdown).
    pub async fn shutdown(self) {
        if let Some(traces) = self.traces {
            traces.shutdown().await;
        }
    }
}

/// Installs the process's subscriber: the filter from the environment, log lines in the
/// format `args` choose on standard error, and, for a command that serves (`traced`), traces
/// when a collector is named. Fails when the trace settings are unusable or a subscriber is
/// installed already. Must be called inside a Tokio runtime.
pub fn install(args: &TelemetryArgs, traced: bool) -> anyhow::Result<Telemetry> {
    let telemetry = if traced {
        Telemetry::start(args, |name| std::env::var(name).ok())?
    } else {
        Telemetry { traces: None }
    };
    let subscriber = traced_subscriber(
        args.log_format,
        filter_from_env(),
        std::io::stderr,
        telemetry.traces(),
    );
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))?;
    Ok(telemetry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[test]
    fn the_log_format_is_a_flag_and_an_environment_variable_defaulting_to_text() {
        let parse = |argv: &[&str]| match crate::cli::Cli::try_parse_from(argv) {
            Ok(cli) => match cli.command {
                crate::cli::Command::Dev(args) => Ok(args.telemetry.log_format),
                other => panic!("parsed {other:?}"),
            },
            Err(e) => Err(e),
        };
        assert_eq!(parse(&["ep", "dev"]).unwrap(), LogFormat::Text);
        assert_eq!(
            parse(&["ep", "dev", "--log-format", "json"]).unwrap(),
            LogFormat::Json
        );
        assert!(parse(&["ep", "dev", "--log-format", "yaml"]).is_err());
    }
}
