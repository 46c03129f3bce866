//! Benchmark: what the content policy costs per environment. The Online Boutique's 35 objects
//! (from `../shared/fixtures`, its LoadBalancer made a ClusterIP as the example template does)
//! and an Ingress for the environment's host are checked against the default policy, over and
//! over, and the time per environment and per object is printed.
//!
//! Run with `cargo bench --bench policy` (no cluster needed). It prints figures and fails only
//! when the check itself is wrong (the ordinary app must pass), never because a machine is slow.

#[path = "../support/mod.rs"]
mod support;

use std::time::Instant;

use previewd::model::crd::PolicySpec;
use previewd::model::grants::OperatorPolicy;
use previewd::model::kinds::TemplateKinds;
use previewd::plan::policy::{Scope, check};
use previewd::plan::render::RenderedObject;
use serde_json::{Value, json};

const ROUNDS: usize = 5;
const CHECKS_PER_ROUND: usize = 2_000;
const HOST: &str = "pr-7.boutique.preview.example.com";

fn main() {
    let objects = environment();
    let (policy, operator, kinds) = (
        PolicySpec::default(),
        OperatorPolicy::default(),
        TemplateKinds::default(),
    );
    let scope = Scope {
        namespace: "bench",
        url_host: HOST,
        operator: &operator,
        kinds: &kinds,
    };
    let refused = check(&objects, &policy, &scope);
    assert!(refused.is_empty(), "the ordinary app passes: {refused:?}");
    let mut per_environment = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        for _ in 0..CHECKS_PER_ROUND {
            std::hint::black_box(check(std::hint::black_box(&objects), &policy, &scope));
        }
        per_environment.push(started.elapsed().as_secs_f64() * 1e6 / CHECKS_PER_ROUND as f64);
    }
    per_environment.sort_by(f64::total_cmp);
    let median = per_environment[ROUNDS / 2];
    println!(
        "content policy, {} objects (Online Boutique and its Ingress), default policy: median {median:.1} µs per environment ({:.0} ns per object), min {:.1}, max {:.1} µs, {ROUNDS} rounds of {CHECKS_PER_ROUND}",
        objects.len(),
        median * 1000.0 / objects.len() as f64,
        per_environment[0],
        per_environment[ROUNDS - 1],
    );
}

/// The Online Boutique as its example template deploys it, plus the Ingress for its host.
fn environment() -> Vec<RenderedObject> {
    let text = std::fs::read_to_string(support::fixture("apps/online-boutique.yaml"))
        .expect("the Online Boutique fixture");
    let mut objects = support::yaml_documents(&text);
    for object in &mut objects {
        if object["kind"] == "Service" && object["spec"]["type"] == "LoadBalancer" {
            object["spec"]["type"] = json!("ClusterIP");
        }
    }
    objects.push(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "frontend"},
        "spec": {"rules": [{"host": HOST, "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": "frontend-external", "port": {"number": 80}}}}]}}]}}),
    );
    objects
        .into_iter()
        .map(|object: Value| RenderedObject {
            manifest: "boutique.yaml".into(),
            wave: 0,
            seed: None,
            object,
        })
        .collect()
}
