//! What the templates read is what the values schema names, and what the Deployment passes is
//! what `execution-provider serve` parses: every `.Values…` path (directly, or through a
//! variable bound to one) resolves in values.schema.json, and the rendered container arguments
//! parse as `serve` flags carrying the values given.

use std::collections::BTreeMap;
use std::path::Path;

use clap::Parser as _;
use execution_provider::cli::{Cli, Command};
use regex::Regex;
use serde_json::Value;

use super::{chart, find, objects, render};

/// Whether `path` (the segments after `.Values`) is named by `schema`; dynamic keys
/// (patternProperties, additionalProperties schemas) end the walk.
fn schema_names(schema: &Value, path: &[&str]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return true;
    };
    if let Some(next) = schema["properties"].get(*first) {
        return schema_names(next, rest);
    }
    schema.get("patternProperties").is_some() || schema["additionalProperties"].is_object()
}

/// Every `.Values` path the chart's templates read, with the file that reads it.
fn values_read() -> Vec<(String, String)> {
    let direct = Regex::new(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)").unwrap();
    let binding =
        Regex::new(r"\$([A-Za-z_][A-Za-z0-9_]*)\s*:=\s*\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
            .unwrap();
    let mut read = Vec::new();
    for entry in std::fs::read_dir(chart().join("templates")).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut bound = BTreeMap::new();
        for capture in binding.captures_iter(&text) {
            bound.insert(capture[1].to_owned(), capture[2].to_owned());
        }
        for capture in direct.captures_iter(&text) {
            read.push((file.clone(), capture[1].to_owned()));
        }
        for (variable, prefix) in &bound {
            let through =
                Regex::new(&format!(r"\${variable}((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")).unwrap();
            for capture in through.captures_iter(&text) {
                read.push((file.clone(), format!("{prefix}{}", &capture[1])));
            }
        }
    }
    read
}

pub fn the_values_schema_names_every_value_the_templates_read(_helm: &Path) {
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart().join("values.schema.json")).unwrap())
            .unwrap();
    let read = values_read();
    for must in [
        "provider.securitySources",
        "provider.securityReloadInterval",
        "provider.maxConcurrentRPCs",
        "provider.maxConcurrentRPCsPerClient",
        "provider.maxConnections",
        "provider.maxTlsHandshakes",
        "networkPolicy.enabled",
        "resourceGovernance.enabled",
        "maintenance.pruneRevisions",
    ] {
        assert!(
            read.iter().any(|(_, path)| path == &format!(".{must}")),
            "the templates read {must}"
        );
    }
    let unnamed: Vec<String> = read
        .iter()
        .filter(|(_, path)| {
            let segments: Vec<&str> = path.trim_start_matches('.').split('.').collect();
            !schema_names(&schema, &segments)
        })
        .map(|(file, path)| format!("{file}: .Values{path}"))
        .collect();
    assert!(
        unnamed.is_empty(),
        "read by the templates, not named by values.schema.json: {unnamed:?}"
    );
}

/// The provider container's arguments, parsed as `execution-provider serve` does.
fn serve_args(rendered: &str) -> (Vec<String>, execution_provider::cli::serve::ServeArgs) {
    let objects = objects(rendered);
    let deployment = find(&objects, "Deployment", "demo-execution-provider");
    let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let cli =
        Cli::try_parse_from(std::iter::once("execution-provider".to_owned()).chain(args.clone()))
            .unwrap_or_else(|e| panic!("serve parses the chart's arguments {args:?}: {e}"));
    let Command::Serve(serve) = cli.command else {
        panic!("the container runs serve: {args:?}");
    };
    (args, *serve)
}

pub fn the_deployment_passes_every_provider_value(helm: &Path) {
    let (_, defaults) = serve_args(&render(helm, &[]).expect("renders"));
    assert_eq!(defaults.security_reload_interval.as_secs(), 2);
    assert_eq!(defaults.limits.global, Some(128));
    assert_eq!(defaults.limits.per_client, Some(32));
    assert_eq!(defaults.connections.connections, Some(1024));
    assert_eq!(defaults.connections.handshakes, Some(64));
    assert_eq!(
        defaults.supervisor_key_file.as_deref(),
        Some(Path::new("/etc/execution-provider/security/supervisor.key")),
        "the supervisor key is required from the security volume by default"
    );
    let (args, keyless) =
        serve_args(&render(helm, &["--set", "provider.supervisorKeyFile="]).expect("renders"));
    assert_eq!(keyless.supervisor_key_file, None, "{args:?}");
    let set = render(
        helm,
        &[
            "--set",
            "provider.securityReloadInterval=750ms,provider.maxConcurrentRPCs=512,provider.maxConcurrentRPCsPerClient=16,provider.maxConnections=300,provider.maxTlsHandshakes=9",
        ],
    )
    .expect("renders");
    let (_, given) = serve_args(&set);
    assert_eq!(given.security_reload_interval.as_millis(), 750);
    assert_eq!(
        (given.limits.global, given.limits.per_client),
        (Some(512), Some(16))
    );
    assert_eq!(
        (given.connections.connections, given.connections.handshakes),
        (Some(300), Some(9))
    );
    let deferred = render(
        helm,
        &[
            "--set",
            "provider.maxConcurrentRPCs=null,provider.maxConcurrentRPCsPerClient=null",
        ],
    )
    .expect("renders");
    let (args, deferred) = serve_args(&deferred);
    assert_eq!(
        (deferred.limits.global, deferred.limits.per_client),
        (None, None),
        "null leaves the RPC bounds to the manifest: {args:?}"
    );

    let sources = render(
        helm,
        &[
            "--set",
            "provider.securitySecretName=",
            "--set-json",
            "provider.securitySources=[{\"name\":\"tls\",\"items\":[{\"key\":\"tls.crt\",\"path\":\"server.pem\"},{\"key\":\"tls.key\",\"path\":\"server.key\"}]},{\"name\":\"trust\",\"items\":[{\"key\":\"ca.crt\",\"path\":\"client-ca.pem\"},{\"key\":\"grant\",\"path\":\"grant.key\"},{\"key\":\"supervisor\",\"path\":\"supervisor.key\"}]}]",
        ],
    )
    .expect("renders with securitySources");
    let objects = objects(&sources);
    let deployment = find(&objects, "Deployment", "demo-execution-provider");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    let security = volumes.iter().find(|v| v["name"] == "security").unwrap();
    let projected = &security["projected"]["sources"];
    assert_eq!(
        projected[0]["configMap"]["items"][0]["path"],
        "manifest.json"
    );
    assert_eq!(projected[1]["secret"]["name"], "tls");
    assert_eq!(projected[1]["secret"]["items"][1]["path"], "server.key");
    assert_eq!(projected[2]["secret"]["name"], "trust");
    assert_eq!(projected[2]["secret"]["items"][0]["key"], "ca.crt");
    assert_eq!(projected.as_array().unwrap().len(), 3);
}

/// `provider.otlpEndpoint` reaches the container as `EXECUTION_PROVIDER_OTLP_ENDPOINT`, which
/// the provider accepts, and the provider's NetworkPolicy opens exactly the collector's ranges
/// on the endpoint's port; without it there is neither.
pub fn the_otlp_endpoint_reaches_the_container_and_its_collector_only(helm: &Path) {
    let env_of = |objects: &[Value]| {
        let deployment = find(objects, "Deployment", "demo-execution-provider");
        deployment["spec"]["template"]["spec"]["containers"][0]["env"].clone()
    };
    let egress_of = |objects: &[Value]| {
        let policy = find(objects, "NetworkPolicy", "demo-execution-provider-provider");
        policy["spec"]["egress"].as_array().unwrap().clone()
    };
    let plain = objects(&render(helm, &[]).expect("renders"));
    assert!(env_of(&plain).is_null(), "no trace settings by default");
    let plain_egress = egress_of(&plain);
    assert_eq!(
        plain_egress.len(),
        2,
        "API server and DNS only: {plain_egress:?}"
    );

    let endpoint = "http://otel-collector.monitoring:4317";
    let traced = objects(
        &render(
            helm,
            &[
                "--set",
                &format!("provider.otlpEndpoint={endpoint}"),
                "--set-json",
                "provider.otlpCollectorCIDRs=[\"10.0.5.0/24\",\"10.0.6.7/32\"]",
            ],
        )
        .expect("renders with a collector"),
    );
    let env = env_of(&traced);
    assert_eq!(env[0]["name"], "EXECUTION_PROVIDER_OTLP_ENDPOINT");
    assert_eq!(env[0]["value"], endpoint);
    let accepted = execution_provider::telemetry::traces::TraceSettings::resolve(
        env[0]["value"].as_str(),
        |_| None,
    );
    assert!(matches!(accepted, Ok(Some(_))), "{accepted:?}");
    let egress = egress_of(&traced);
    assert_eq!(egress.len(), 3, "{egress:?}");
    assert_eq!(egress[2]["to"][0]["ipBlock"]["cidr"], "10.0.5.0/24");
    assert_eq!(egress[2]["to"][1]["ipBlock"]["cidr"], "10.0.6.7/32");
    assert_eq!(egress[2]["ports"][0]["port"], 4317);
    assert_eq!(egress[2]["ports"][0]["protocol"], "TCP");
    assert_eq!(egress[..2], plain_egress[..]);

    let tls = objects(
        &render(
            helm,
            &[
                "--set",
                "provider.otlpEndpoint=https://collector.example",
                "--set-json",
                "provider.otlpCollectorCIDRs=[\"192.0.2.8/32\"]",
            ],
        )
        .expect("renders with a TLS collector"),
    );
    assert_eq!(
        egress_of(&tls)[2]["ports"][0]["port"],
        443,
        "https without a port"
    );

    for (extra, named) in [
        (
            vec!["--set", "provider.otlpEndpoint=http://c:4317"],
            "provider.otlpCollectorCIDRs",
        ),
        (
            vec![
                "--set-json",
                "provider.otlpCollectorCIDRs=[\"10.0.5.0/24\"]",
            ],
            "without provider.otlpEndpoint",
        ),
        (
            vec![
                "--set",
                "provider.otlpEndpoint=c:4317",
                "--set-json",
                "provider.otlpCollectorCIDRs=[\"10.0.5.0/24\"]",
            ],
            "otlpEndpoint",
        ),
        (
            vec![
                "--set",
                "provider.otlpEndpoint=http://c:4317",
                "--set-json",
                "provider.otlpCollectorCIDRs=[\"0.0.0.0/0\"]",
            ],
            "together these ranges allow every public",
        ),
    ] {
        let refusal = render(helm, &extra).expect_err(&format!("{extra:?} is refused"));
        assert!(refusal.contains(named), "{extra:?}: {refusal}");
    }
}
