//! Distributed traces (docs/operating.md, "Traces"): `tracing` spans exported with
//! OpenTelemetry over OTLP/gRPC, off unless the operator names a collector.
//!
//! [`TraceSettings::resolve`] decides from `--otlp-endpoint` and the standard `OTEL_*`
//! variables whether traces are on; [`Traces::start`] builds the exporter (a batch span
//! processor with a bounded queue, 2,048 spans by default: a span that finds it full is
//! dropped, never waited for)
//! and [`Traces::layer`] the subscriber layer that turns the provider's own spans, and only
//! them, into OpenTelemetry spans. [`Traces::shutdown`] flushes what is queued.
//!
//! Every span of a trace is created on [`TARGET`]: one per RPC ([`rpc`]), the store's steps
//! (validation, dispatch, the compare-and-swap status writes), the Kubernetes API requests
//! ([`kube_api`]) and the executor calls ([`executor`]). The fields of these spans are the
//! method, code, verb, resource, operation, outcome and environment id, never an owner, a
//! binding, a grant or a claim, nor anything a call carries (paths, contents, commands).
//! Spans below the RPC exist only inside a traced call ([`child_span!`]): the reconciler's
//! own requests start no traces.

pub mod executor;
pub mod kube_api;
pub mod rpc;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::runtime::IdSource;
use crate::store::StoreError;

/// The `tracing` target of every span that becomes part of a trace.
pub const TARGET: &str = "execution_provider::trace";

/// The `service.name` of the exported spans without `OTEL_SERVICE_NAME`.
pub const DEFAULT_SERVICE_NAME: &str = "execution-provider";

/// How long a graceful shutdown waits for the queued spans to be exported.
pub const SHUTDOWN_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The standard variables, most specific first, that name the collector when no flag does.
pub const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Where and as what spans are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSettings {
    /// The collector's OTLP/gRPC endpoint (`http://` or `https://`).
    pub endpoint: String,
    /// The `service.name` resource attribute.
    pub service_name: String,
}

/// Why the trace settings cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TraceSettingsError {
    /// The endpoint is not an absolute `http` or `https` URL with a host.
    #[error(
        "{source_name}: {endpoint:?} is not an http:// or https:// URL of an OTLP/gRPC collector"
    )]
    Endpoint {
        /// The flag or variable that named it.
        source_name: String,
        /// What it said.
        endpoint: String,
    },
    /// `OTEL_TRACES_EXPORTER` names an exporter other than `otlp` or `none`.
    #[error("OTEL_TRACES_EXPORTER={0:?}: only `otlp` and `none` are supported")]
    Exporter(String),
}

impl TraceSettings {
    /// Traces are on when `flag` (`--otlp-endpoint`) or one of [`ENDPOINT_VARIABLES`] names a
    /// collector, in that order, unless `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
    /// `env` reads an environment variable (an empty value counts as unset). Nothing else
    /// turns them on: there is no default collector.
    pub fn resolve(
        flag: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, TraceSettingsError> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match var("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase()) {
            Some(exporter) if exporter == "none" => return Ok(None),
            Some(exporter) if exporter != "otlp" => {
                return Err(TraceSettingsError::Exporter(exporter));
            }
            _ => {}
        }
        let named = flag
            .filter(|f| !f.trim().is_empty())
            .map(|f| ("--otlp-endpoint".to_owned(), f.to_owned()))
            .or_else(|| {
                ENDPOINT_VARIABLES
                    .iter()
                    .find_map(|name| var(name).map(|v| ((*name).to_owned(), v)))
            });
        let Some((source_name, endpoint)) = named else {
            return Ok(None);
        };
        let endpoint = endpoint.trim().to_owned();
        if !is_collector_url(&endpoint) {
            return Err(TraceSettingsError::Endpoint {
                source_name,
                endpoint,
            });
        }
        Ok(Some(Self {
            endpoint,
            service_name: var("OTEL_SERVICE_NAME")
                .map(|v| v.trim().to_owned())
                .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned()),
        }))
    }
}

fn is_collector_url(text: &str) -> bool {
    url::Url::parse(text)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
}

/// A running trace pipeline: the tracer provider with its batch exporter.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Builds the OTLP/gRPC exporter to `settings.endpoint` and the provider around it.
    /// Nothing connects yet: the first export does, and a collector that cannot be reached
    /// only costs the dropped batches. Must be called inside a Tokio runtime (the exporter's
    /// channel is driven by it). Trace and span ids are drawn from `ids`; the sampler is the
    /// standard `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default: follow the
    /// caller's sampled flag, sample every root), and `OTEL_BSP_*` tune the batches.
    pub fn start(settings: &TraceSettings, ids: Arc<dyn IdSource>) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(settings.endpoint.clone())
            .build()
            .with_context(|| format!("cannot build the OTLP exporter to {}", settings.endpoint))?;
        // The standard bounds: 2,048 queued spans, batches of 512 every 5 s, 10 s an export
        // (`OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_TIMEOUT` change them).
        let batches = BatchSpanProcessor::builder(exporter).build();
        let resource = Resource::builder()
            .with_service_name(settings.service_name.clone())
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batches)
            .with_resource(resource)
            .with_id_generator(SeamIds(ids))
            .build();
        Ok(Self { provider })
    }

    /// The layer exporting the spans of [`TARGET`] (no events: what a log line carries stays
    /// in the logs).
    pub fn layer<S>(&self) -> Box<dyn Layer<S> + Send + Sync>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let tracer = self.provider.tracer(DEFAULT_SERVICE_NAME);
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_threads(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.is_span() && meta.target() == TARGET
            }))
            .boxed()
    }

    /// Exports what is queued and stops the exporter, waiting at most
    /// [`SHUTDOWN_FLUSH_TIMEOUT`]; a collector that does not answer in time loses those spans.
    pub async fn shutdown(self) {
        let provider = self.provider;
        // The flush blocks its thread while the exporter's channel runs on the runtime.
        let flushed = tokio::task::spawn_blocking(move || {
            provider.shutdown_with_timeout(SHUTDOWN_FLUSH_TIMEOUT)
        })
        .await;
        match flushed {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!("traces were not all exported at shutdown: {error}"),
            Err(error) => tracing::warn!("the trace exporter did not shut down: {error}"),
        }
    }
}

/// Trace and span ids from the randomness seam.
struct SeamIds(Arc<dyn IdSource>);

impl std::fmt::Debug for SeamIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SeamIds")
    }
}

impl opentelemetry_sdk::trace::IdGenerator for SeamIds {
    fn new_trace_id(&self) -> TraceId {
        let mut bytes = [0u8; 16];
        // An all-zero id is invalid; draw again (practically never).
        while bytes == [0; 16] {
            self.0.fill(&mut bytes);
        }
        TraceId::from_bytes(bytes)
    }

    fn new_span_id(&self) -> SpanId {
        let mut bytes = [0u8; 8];
        while bytes == [0; 8] {
            self.0.fill(&mut bytes);
        }
        SpanId::from_bytes(bytes)
    }
}

/// Records `store.outcome` on `span`: `ok`, or the bounded class of the store's refusal
/// ([`StoreError::diagnostic_class`]); a failed Kubernetes request also marks it an error.
pub fn record_store_outcome<T>(span: &tracing::Span, result: &Result<T, StoreError>) {
    match result {
        Ok(_) => span.record("store.outcome", "ok"),
        Err(error) => {
            if matches!(error, StoreError::Kube { .. }) {
                span.record("otel.status_code", "error");
            }
            span.record("store.outcome", error.diagnostic_class())
        }
    };
}

/// A span on [`TARGET`] inside the current span, or a disabled span when there is none (work
/// outside a traced call, such as the reconciler's, starts no trace).
#[macro_export]
macro_rules! child_span {
    ($name:expr $(, $($fields:tt)*)?) => {
        if ::tracing::Span::current().is_none() {
            ::tracing::Span::none()
        } else {
            ::tracing::info_span!(target: $crate::telemetry::traces::TARGET, $name $(, $($fields)*)?)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn resolve(
        flag: Option<&str>,
        vars: &[(&str, &str)],
    ) -> Result<Option<TraceSettings>, TraceSettingsError> {
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        TraceSettings::resolve(flag, |name| vars.get(name).cloned())
    }

    fn on(endpoint: &str, service: &str) -> Option<TraceSettings> {
        Some(TraceSettings {
            endpoint: endpoint.to_owned(),
            service_name: service.to_owned(),
        })
    }

    #[test]
    fn traces_are_off_unless_a_collector_is_named() {
        assert_eq!(resolve(None, &[]), Ok(None));
        assert_eq!(
            resolve(Some(""), &[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]),
            Ok(None)
        );
        assert_eq!(
            resolve(
                None,
                &[
                    ("OTEL_SERVICE_NAME", "x"),
                    ("OTEL_TRACES_SAMPLER", "always_on")
                ]
            ),
            Ok(None)
        );
    }

    #[test]
    fn the_flag_wins_over_the_traces_variable_which_wins_over_the_general_one() {
        let both = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317"),
        ];
        assert_eq!(
            resolve(Some("https://flag:4317"), &both),
            Ok(on("https://flag:4317", DEFAULT_SERVICE_NAME))
        );
        assert_eq!(
            resolve(None, &both),
            Ok(on("http://traces:4317", DEFAULT_SERVICE_NAME))
        );
        assert_eq!(
            resolve(None, &both[..1]),
            Ok(on("http://general:4317", DEFAULT_SERVICE_NAME))
        );
    }

    #[test]
    fn the_service_name_comes_from_otel_service_name() {
        assert_eq!(
            resolve(
                Some("http://127.0.0.1:4317"),
                &[("OTEL_SERVICE_NAME", "provider-eu")]
            ),
            Ok(on("http://127.0.0.1:4317", "provider-eu"))
        );
    }

    #[test]
    fn the_sdk_switches_and_the_exporter_choice_are_honoured() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
        assert_eq!(
            resolve(None, &[endpoint, ("OTEL_SDK_DISABLED", "true")]),
            Ok(None)
        );
        assert_eq!(
            resolve(None, &[endpoint, ("OTEL_TRACES_EXPORTER", "none")]),
            Ok(None)
        );
        assert!(
            resolve(None, &[endpoint, ("OTEL_TRACES_EXPORTER", "otlp")])
                .unwrap()
                .is_some()
        );
        assert_eq!(
            resolve(None, &[endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")]),
            Err(TraceSettingsError::Exporter("zipkin".into()))
        );
    }

    #[test]
    fn an_endpoint_must_be_an_http_or_https_url() {
        for bad in [
            "127.0.0.1:4317",
            "unix:///run/otel.sock",
            "ftp://c:21",
            "http://",
        ] {
            assert!(
                matches!(
                    resolve(Some(bad), &[]),
                    Err(TraceSettingsError::Endpoint { .. })
                ),
                "{bad}"
            );
        }
        let error = resolve(None, &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "c:4317")]).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT:"),
            "{error}"
        );
    }
}
