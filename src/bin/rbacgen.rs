//! Prints the chart's RBAC, generated from previewd's kind list:
//! `cargo run --bin rbacgen > charts/previewd/templates/rbac.yaml`.
fn main() {
    print!("{}", previewd::model::rbac::chart_rbac_yaml());
}
