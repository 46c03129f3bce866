//! Small fixtures for the plan's and the reconciler's pure steps: objects written as YAML, the way a user
//! would write them, parsed into previewd's types. No API server.

use crate::model::crd::{PreviewEnvironment, PreviewTemplate};

/// A `PreviewTemplate` from YAML (`apiVersion` and `kind` may be left out).
pub fn template(yaml: &str) -> PreviewTemplate {
    from_yaml(yaml, "PreviewTemplate")
}

/// A `PreviewEnvironment` from YAML (`apiVersion` and `kind` may be left out).
pub fn environment(yaml: &str) -> PreviewEnvironment {
    from_yaml(yaml, "PreviewEnvironment")
}

fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str, kind: &str) -> T {
    let mut value: serde_json::Value = serde_yaml_ng::from_str(yaml).expect("fixture is YAML");
    value["apiVersion"] = "previewd.dev/v1alpha1".into();
    value["kind"] = kind.into();
    serde_json::from_value(value).expect("fixture fits the type")
}

/// The web template of the tests: a ConfigMap and a Deployment, the host rendered per branch.
pub const WEB_TEMPLATE: &str = r#"
metadata: {name: web, namespace: team-a}
spec:
  forge: {kind: github, repository: Codertocat/Hello-World}
  url: {host: "{{ slug }}.preview.example.com"}
  manifests:
    inline:
      - name: web.yaml
        template: |
          apiVersion: v1
          kind: ConfigMap
          metadata: {name: settings}
          data: {sha: "{{ short_sha }}", url: "{{ url }}"}
          ---
          apiVersion: apps/v1
          kind: Deployment
          metadata:
            name: web
            annotations: {previewd.dev/wave: "1"}
          spec:
            replicas: 2
            selector: {matchLabels: {app: web}}
            template:
              metadata: {labels: {app: web}}
              spec: {containers: [{name: web, image: "nginx:{{ short_sha }}"}]}
"#;

/// An environment of [`WEB_TEMPLATE`] for pull request 2.
pub const WEB_ENVIRONMENT: &str = r#"
metadata: {name: web-pr-2, namespace: team-a, generation: 3}
spec:
  template: web
  source:
    repository: Codertocat/Hello-World
    branch: feature/Login
    pullRequest: 2
    headSha: ec26c3e57ca3a959ca5aad62de7213c562f8c821
  lastActivity: "2026-11-22T10:00:00Z"
"#;
