//! Properties of the canonical revision id (DECISIONS 13): it does not move when the YAML of
//! an execution block is reordered or reformatted (key order, indentation, flow or block
//! style, quoting), and it moves when any semantic field changes.

use proptest::prelude::*;

use super::*;

/// One execution block as (YAML key, scalar text) pairs; numbers are unquoted integers.
#[derive(Debug, Clone)]
struct Block {
    fields: Vec<(&'static str, Scalar)>,
}

#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    Text(String),
    Int(i64),
}

fn block() -> impl Strategy<Value = Block> {
    (
        "[0-9a-f]{64}",
        prop::sample::select(vec!["standard", "fast-ssd"]),
        prop::sample::select(vec!["1Gi", "2Gi", "500Mi"]),
        prop::sample::select(vec!["100m", "250m"]),
        prop::sample::select(vec!["1", "2"]),
        prop::sample::select(vec!["gvisor", "kata"]),
        1i64..=5_242_880,
        1i64..=1_048_576,
        prop::sample::select(vec!["1m", "90s", "5m"]),
        1i64..=10_000,
    )
        .prop_map(
            |(digest, class, size, cpu_req, cpu_lim, runtime, file, command, duration, max)| {
                let text = |s: &str| Scalar::Text(s.to_owned());
                Block {
                    fields: vec![
                        (
                            "image",
                            Scalar::Text(format!("registry.example/executor@sha256:{digest}")),
                        ),
                        ("storageClass", text(class)),
                        ("storageSize", text(size)),
                        ("cpuRequest", text(cpu_req)),
                        ("cpuLimit", text(cpu_lim)),
                        ("memoryRequest", text("128Mi")),
                        ("memoryLimit", text("512Mi")),
                        ("ephemeralStorageRequest", text("256Mi")),
                        ("ephemeralStorageLimit", text("1Gi")),
                        ("tmpSizeLimit", text("64Mi")),
                        ("runtimeClassName", text(runtime)),
                        ("maxFileBytes", Scalar::Int(file)),
                        ("maxCommandBytes", Scalar::Int(command)),
                        ("maxCommandDuration", text(duration)),
                        ("maxEnvironments", Scalar::Int(max)),
                    ],
                }
            },
        )
}

/// How a block is written.
#[derive(Debug, Clone)]
struct Style {
    order: Vec<usize>,
    flow: bool,
    indent: usize,
    quotes: Vec<u8>,
}

fn style(len: usize) -> impl Strategy<Value = Style> {
    (
        Just((0..len).collect::<Vec<_>>()).prop_shuffle(),
        any::<bool>(),
        1usize..=4,
        prop::collection::vec(0u8..3, len),
    )
        .prop_map(|(order, flow, indent, quotes)| Style {
            order,
            flow,
            indent,
            quotes,
        })
}

fn scalar(value: &Scalar, quote: u8) -> String {
    match value {
        Scalar::Int(n) => n.to_string(),
        // A text that reads as a number must stay a string: never plain.
        Scalar::Text(s) if quote == 0 && s.parse::<f64>().is_err() => s.clone(),
        Scalar::Text(s) if quote == 1 => format!("'{s}'"),
        Scalar::Text(s) => format!("\"{s}\""),
    }
}

fn render(block: &Block, style: &Style) -> String {
    let entries: Vec<String> = style
        .order
        .iter()
        .map(|&i| {
            let (key, value) = &block.fields[i];
            format!("{key}: {}", scalar(value, style.quotes[i]))
        })
        .collect();
    if style.flow {
        format!("{{{}}}\n", entries.join(", "))
    } else {
        let pad = " ".repeat(style.indent);
        entries
            .iter()
            .map(|e| format!("{pad}{e}\n"))
            .collect::<String>()
    }
}

fn revision_of(yaml: &str) -> String {
    let spec: ProfileSpec = serde_saphyr::from_str(yaml).expect("the block decodes");
    canonical_template_revision(&spec.validate().expect("the block is valid"))
}

/// A different value of `key` that keeps the block valid.
fn alternative(key: &str, current: &str) -> String {
    let other = |a: &str, b: &str| if current == a { b } else { a }.to_owned();
    match key {
        "image" => {
            let (name, digest) = current.split_once("@sha256:").expect("pinned");
            let first = if digest.starts_with('0') { "1" } else { "0" };
            format!("{name}@sha256:{first}{}", &digest[1..])
        }
        "storageClass" | "runtimeClassName" => format!("{current}-b"),
        "storageSize" => other("3Gi", "4Gi"),
        "cpuRequest" => other("50m", "60m"),
        "cpuLimit" => other("3", "4"),
        "memoryRequest" => other("64Mi", "32Mi"),
        "memoryLimit" => other("1Gi", "2Gi"),
        "ephemeralStorageRequest" => other("128Mi", "64Mi"),
        "ephemeralStorageLimit" => other("2Gi", "3Gi"),
        "tmpSizeLimit" => other("32Mi", "16Mi"),
        "maxCommandDuration" => other("4m", "3m"),
        other_key => panic!("no alternative for {other_key}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_revision_is_stable_under_reordering_and_reformatting(
        block in block(),
        a in style(15),
        b in style(15),
    ) {
        prop_assert_eq!(revision_of(&render(&block, &a)), revision_of(&render(&block, &b)));
    }

    #[test]
    fn the_revision_changes_with_any_semantic_field(
        block in block(),
        field in 0usize..15,
        layout in style(15),
    ) {
        let before = revision_of(&render(&block, &layout));
        let mut changed = block.clone();
        changed.fields[field].1 = match &block.fields[field].1 {
            Scalar::Int(n) if *n > 1 => Scalar::Int(n - 1),
            Scalar::Int(n) => Scalar::Int(n + 1),
            Scalar::Text(s) => Scalar::Text(alternative(block.fields[field].0, s)),
        };
        prop_assume!(changed.fields[field] != block.fields[field]);
        let after = revision_of(&render(&changed, &layout));
        prop_assert_ne!(before, after);
    }
}
