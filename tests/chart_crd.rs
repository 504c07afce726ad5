//! The chart ships the CRD generated from the Rust types; this fails when the two drift.
//! Regenerate with `cargo run -- crd --output charts/execution-provider/crds/executionenvironment.yaml`.

use execution_provider::cli::CHART_CRD_PATH;
use execution_provider::kube::crd::crd_yaml;

#[test]
fn the_chart_crd_equals_the_crd_generated_from_the_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(CHART_CRD_PATH);
    let shipped = std::fs::read_to_string(&path).expect("the chart carries the CRD");
    assert!(
        shipped == crd_yaml(),
        "{} is stale: regenerate it with `cargo run -- crd --output {CHART_CRD_PATH}`",
        path.display()
    );
}
