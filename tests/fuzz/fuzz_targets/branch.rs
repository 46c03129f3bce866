//! Arbitrary text as a branch name: the environment and namespace names made from it are
//! valid DNS-1123 labels, and rendering it into a manifest never panics nor places an object
//! outside the environment's namespace without the guard noticing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use previewd::model::naming;

fuzz_target!(|data: &[u8]| {
    let Ok(branch) = std::str::from_utf8(data) else {
        return;
    };
    let environment = naming::environment_name("app", branch, None);
    assert!(naming::is_dns1123_label(&environment), "{environment:?}");
    let target = naming::namespace_name("preview", "previews", &environment);
    assert!(naming::is_dns1123_label(&target), "{target:?}");

    let manifest = previewd::model::crd::InlineManifest {
        name: "app.yaml".into(),
        template: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n  labels: {slug: \"{{ slug }}\"}\ndata:\n  branch: \"{{ branch }}\"\n".into(),
    };
    let context = previewd::plan::render::RenderContext {
        name: environment.clone(),
        branch: branch.to_string(),
        slug: naming::slug(branch),
        sha: "0".repeat(40),
        short_sha: "0000000".into(),
        pr: None,
        repository: "o/r".into(),
        author: "someone".into(),
        namespace: target.clone(),
        host: "x.example.com".into(),
        url: "https://x.example.com".into(),
        values: Default::default(),
    };
    if let Ok(objects) = previewd::plan::render::render(&[manifest], &[], &context, &Default::default()) {
        let violations = previewd::plan::guard::check(&objects, &target);
        for object in &objects {
            let inside = object.object["metadata"]["namespace"] == target.as_str();
            assert!(inside || !violations.is_empty());
        }
    }
});
