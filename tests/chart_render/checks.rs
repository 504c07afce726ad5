//! The chart's own render checks (beyond the schema): open egress, however it is split, the
//! security sources, the limiter bounds and the always-on switches.

use std::path::Path;

use super::{find, objects, render};

fn profile(egress: &str) -> String {
    format!("networkPolicy.workloadProfiles={{\"default\":{{\"egress\":{egress}}}}}")
}

fn rule(cidr: &str, except: &[&str]) -> String {
    let except: Vec<String> = except.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        "{{\"cidr\":\"{cidr}\",\"except\":[{}],\"ports\":[{{\"port\":443}}]}}",
        except.join(",")
    )
}

fn rules(rules: Rules) -> String {
    let rendered: Vec<String> = rules.iter().map(|(c, e)| rule(c, e)).collect();
    profile(&format!("[{}]", rendered.join(",")))
}

const OPEN: &str = "together these ranges allow every public";

/// The test values' default revision set to `network: outbound`.
const OUTBOUND_REVISION: &str = "templates.default.revisions.v1-fc8098ef55abb210d60af3b2bf78c5f8a91062edfdf49995ac5896b0c60f2899.execution.network=outbound";

/// Egress rules: each a CIDR and its exceptions.
type Rules<'a> = &'a [(&'a str, &'a [&'a str])];

pub fn the_egress_check_refuses_every_split_of_the_public_address_space(helm: &Path) {
    let refused: [(Rules, &str); 8] = [
        (&[("0.0.0.0/1", &[]), ("128.0.0.0/1", &[])], "IPv4"),
        (&[("0.0.0.0/0", &[])], "IPv4"),
        (
            &[
                ("0.0.0.0/2", &[]),
                ("64.0.0.0/2", &[]),
                ("128.0.0.0/2", &[]),
                ("192.0.0.0/3", &[]),
            ],
            "IPv4",
        ),
        // Exceptions that only carve out private ranges leave every public address open.
        (
            &[(
                "0.0.0.0/0",
                &["10.0.0.0/8", "192.168.0.0/16", "100.64.0.0/10"],
            )],
            "IPv4",
        ),
        // One block's exception is another block's allowance.
        (
            &[("0.0.0.0/0", &["8.8.8.0/24"]), ("8.0.0.0/8", &[])],
            "IPv4",
        ),
        (&[("2000::/3", &[])], "IPv6"),
        (&[("2000::/4", &[]), ("3000::/4", &[])], "IPv6"),
        (&[("::/0", &["2001:db8::/32", "fc00::/7"])], "IPv6"),
    ];
    for (set, family) in refused {
        let refusal =
            render(helm, &["--set-json", &rules(set)]).expect_err(&format!("{set:?} is refused"));
        assert!(
            refusal.contains(&format!("{OPEN} {family} address")),
            "{set:?} refused, but not as open {family} egress: {refusal}"
        );
    }
    let allowed: [Rules; 5] = [
        &[("0.0.0.0/1", &[])],
        &[("0.0.0.0/0", &["8.8.8.8/32"])],
        &[
            ("0.0.0.0/1", &[]),
            ("128.0.0.0/2", &[]),
            ("192.0.0.0/4", &[]),
        ],
        &[("2000::/4", &[]), ("10.0.0.0/8", &[])],
        &[("::/0", &["2600::/12"])],
    ];
    for set in allowed {
        let rendered = render(helm, &["--set-json", &rules(set)])
            .unwrap_or_else(|e| panic!("{set:?} leaves public addresses closed: {e}"));
        let objects = objects(&rendered);
        let policy = objects
            .iter()
            .find(|o| {
                o["kind"] == "NetworkPolicy"
                    && o["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.contains("-profile-"))
            })
            .expect("the profile policy is rendered");
        let block = &policy["spec"]["egress"][0]["to"][0]["ipBlock"];
        assert_eq!(block["cidr"], set[0].0);
        if !set[0].1.is_empty() {
            assert_eq!(block["except"][0], set[0].1[0], "exceptions are rendered");
        }
    }
    for (set, named) in [
        (
            rules(&[("10.0.0.0/8", &["11.0.0.0/8"])]),
            "except 11.0.0.0/8 is not inside 10.0.0.0/8",
        ),
        (rules(&[("300.0.0.0/8", &[])]), "300.0.0.0/8 is not a CIDR"),
        (rules(&[("10.0.0.0/33", &[])]), "10.0.0.0/33 is not a CIDR"),
        (rules(&[("2000:::1/16", &[])]), "2000:::1/16 is not a CIDR"),
        (rules(&[("1::2::3/64", &[])]), "1::2::3/64 is not a CIDR"),
        (
            rules(&[("1:2:3:4:5:6:7:8::1::2/64", &[])]),
            "1:2:3:4:5:6:7:8::1::2/64 is not a CIDR",
        ),
        (
            rules(&[("1:2:3:4::5:6:7:8/64", &[])]),
            "1:2:3:4::5:6:7:8/64 is not a CIDR",
        ),
        (rules(&[("1:2:3/48", &[])]), "1:2:3/48 is not a CIDR"),
        (rules(&[("1.2.3/24", &[])]), "1.2.3/24 is not a CIDR"),
        (rules(&[("1.2.3.4", &[])]), "1.2.3.4 is not a CIDR"),
    ] {
        // Past the schema (its pattern already refuses some of these): the check stands alone.
        let refusal =
            render(helm, &["--skip-schema-validation", "--set-json", &set]).expect_err(&set);
        assert!(refusal.contains(named), "{set}: {refusal}");
    }
    // The provider's own egress, API server and DNS together, is held to the same rule.
    let refusal = render(
        helm,
        &[
            "--set-json",
            "provider.apiServerCIDRs=[\"0.0.0.0/1\"]",
            "--set-json",
            "provider.dnsCIDRs=[\"128.0.0.0/1\"]",
        ],
    )
    .expect_err("the provider's egress may not cover the internet either");
    assert!(
        refusal.contains("provider.apiServerCIDRs and provider.dnsCIDRs") && refusal.contains(OPEN),
        "{refusal}"
    );
}

pub fn the_render_checks_refuse_what_the_schema_cannot_express(helm: &Path) {
    let source = |items: &str| {
        format!("provider.securitySources=[{{\"name\":\"tls\",\"items\":[{items}]}}]")
    };
    let manifest_files = "{\"key\":\"c\",\"path\":\"server.pem\"},{\"key\":\"k\",\"path\":\"server.key\"},{\"key\":\"ca\",\"path\":\"client-ca.pem\"},{\"key\":\"g\",\"path\":\"grant.key\"}";
    let all = &format!("{manifest_files},{{\"key\":\"s\",\"path\":\"supervisor.key\"}}");
    let without_name = ["--set", "provider.securitySecretName="];
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--set-json".into(), source(all)],
            "provider.securitySecretName and provider.securitySources are mutually exclusive",
        ),
        (
            without_name.iter().map(|s| s.to_string()).collect(),
            "provider.securitySecretName or provider.securitySources is required",
        ),
        (
            vec![
                without_name[0].into(),
                without_name[1].into(),
                "--set-json".into(),
                source(
                    "{\"key\":\"c\",\"path\":\"server.pem\"},{\"key\":\"k\",\"path\":\"server.key\"},{\"key\":\"ca\",\"path\":\"client-ca.pem\"}",
                ),
            ],
            "the security manifest names grant.key, which no source projects",
        ),
        (
            vec![
                without_name[0].into(),
                without_name[1].into(),
                "--set-json".into(),
                source(manifest_files),
            ],
            "provider.supervisorKeyFile is supervisor.key, which no source projects",
        ),
        (
            vec![
                "--set".into(),
                "provider.supervisorKeyFile=manifest.json".into(),
            ],
            "provider.supervisorKeyFile: manifest.json is reserved",
        ),
        (
            vec![
                without_name[0].into(),
                without_name[1].into(),
                "--set-json".into(),
                source(&format!(
                    "{all},{{\"key\":\"m\",\"path\":\"manifest.json\"}}"
                )),
            ],
            "manifest.json is reserved",
        ),
        (
            vec![
                without_name[0].into(),
                without_name[1].into(),
                "--set-json".into(),
                source(&format!(
                    "{all},{{\"key\":\"again\",\"path\":\"server.pem\"}}"
                )),
            ],
            "path server.pem is projected twice",
        ),
        (
            vec![
                without_name[0].into(),
                without_name[1].into(),
                "--set-json".into(),
                source(&format!("{all},{{\"key\":\"c\",\"path\":\"other.pem\"}}")),
            ],
            "key c of Secret tls is projected twice",
        ),
        (
            vec![
                without_name[0].into(),
                without_name[1].into(),
                "--set-json".into(),
                format!(
                    "provider.securitySources=[{{\"name\":\"tls\",\"items\":[{all}]}},{{\"name\":\"tls\",\"items\":[{{\"key\":\"x\",\"path\":\"x\"}}]}}]"
                ),
            ],
            "Secret tls is listed twice",
        ),
        (
            vec![
                "--set".into(),
                "provider.maxConcurrentRPCs=8,provider.maxConcurrentRPCsPerClient=9".into(),
            ],
            "provider.maxConcurrentRPCsPerClient must not exceed provider.maxConcurrentRPCs",
        ),
        (
            vec![
                "--skip-schema-validation".into(),
                "--set".into(),
                "networkPolicy.enabled=false".into(),
            ],
            "networkPolicy.enabled must be true",
        ),
        (
            vec![
                "--skip-schema-validation".into(),
                "--set".into(),
                "resourceGovernance.enabled=false".into(),
            ],
            "resourceGovernance.enabled must be true",
        ),
        (
            // The schema requires egress in every profile: only a missing profile is left.
            vec![
                "--skip-schema-validation".into(),
                "--set".into(),
                OUTBOUND_REVISION.into(),
                "--set".into(),
                "networkPolicy.workloadProfiles.default=null".into(),
            ],
            "templates.default: revision v1-fc8098ef55abb210d60af3b2bf78c5f8a91062edfdf49995ac5896b0c60f2899 asks for network: outbound, but networkPolicy.workloadProfiles.default has no egress",
        ),
    ];
    for (extra, named) in cases {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let refusal = render(helm, &extra).expect_err(&format!("{extra:?} is refused"));
        assert!(refusal.contains(named), "{extra:?}: {refusal}");
    }
    // With its template's egress, an outbound revision renders.
    render(
        helm,
        &[
            "--set",
            OUTBOUND_REVISION,
            "--set-json",
            &rules(&[("10.0.0.0/8", &[])]),
        ],
    )
    .expect("an outbound revision with its egress renders");
    let many: Vec<String> = (0..33)
        .map(|i| format!("{{\"key\":\"k{i}\",\"path\":\"p{i}\"}}"))
        .collect();
    let sources: Vec<String> = many
        .chunks(11)
        .enumerate()
        .map(|(i, items)| format!("{{\"name\":\"s{i}\",\"items\":[{}]}}", items.join(",")))
        .collect();
    let refusal = render(
        helm,
        &[
            "--set",
            "provider.securitySecretName=",
            "--set-json",
            &format!("provider.securitySources=[{}]", sources.join(",")),
        ],
    )
    .expect_err("33 mappings are refused");
    assert!(refusal.contains("at most 32 key mappings"), "{refusal}");
    let rendered = render(
        helm,
        &[
            "--set",
            "provider.securitySecretName=",
            "--set-json",
            &source(all),
        ],
    )
    .expect("sources that project every file the manifest names render");
    assert!(find(&objects(&rendered), "Deployment", "demo-execution-provider").is_object());
    render(
        helm,
        &[
            "--set",
            "provider.securitySecretName=,provider.supervisorKeyFile=",
            "--set-json",
            &source(manifest_files),
        ],
    )
    .expect("without a supervisor key file, sources need not project one");
}
