//! Prints previewd's CRDs as YAML: `cargo run --bin crdgen > crds/previewd.dev.yaml`.
fn main() {
    print!("{}", previewd::model::crd::crds_yaml());
}
