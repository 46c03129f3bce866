//! Arbitrary template text (a template author's, or a pull request's with
//! `manifests.repositoryPath`) rendered as previewd renders it: within the fuel and output
//! limits, and then through the guard and the default content policy. Nothing panics, no
//! render runs away (libFuzzer's `-timeout` and `-rss_limit_mb` catch one that does), and no
//! object leaves the environment's namespace without the guard refusing it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use previewd::model::crd::{InlineManifest, PolicySpec};
use previewd::plan::{guard, policy, render};

const NAMESPACE: &str = "preview-app-0123456789abcdef";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let context = render::RenderContext {
        name: "app-pr-1".into(),
        branch: "feature/x".into(),
        slug: "feature-x".into(),
        sha: "0".repeat(40),
        short_sha: "0000000".into(),
        pr: Some(1),
        repository: "o/r".into(),
        author: "someone".into(),
        namespace: NAMESPACE.into(),
        host: "app-pr-1.preview.example.com".into(),
        url: "https://app-pr-1.preview.example.com".into(),
        values: Default::default(),
    };
    if let Ok(host) = render::render_string("url.host", text, &context) {
        assert!(host.len() <= render::MAX_RENDERED_BYTES);
    }
    let manifest = InlineManifest {
        name: "app.yaml".into(),
        template: text.to_string(),
    };
    let Ok(objects) = render::render(&[manifest], &[], &context, &Default::default()) else {
        return;
    };
    let violations = guard::check(&objects, NAMESPACE);
    for object in &objects {
        let inside = object.object["metadata"]["namespace"] == NAMESPACE;
        assert!(inside || !violations.is_empty(), "{:?}", object.object);
    }
    let _ = policy::check(&objects, &PolicySpec::default(), NAMESPACE, &context.host);
});
