//! What previewd reads of a kustomization must be what Kustomize reads (pure). Kustomize turns
//! the YAML into JSON (applying YAML 1.1 merge keys) and decodes it with Go's JSON decoder,
//! which matches field names without regard to case and refuses unknown ones. A check that
//! reads `resources` but not `Resources`, or not a `<<: *base` that brings a `resources` in,
//! would let a file reach Kustomize unchecked. And Kustomize's plugins (`generators`,
//! `transformers`, `validators`, Helm charts) take configurations that fetch URLs.
//!
//! So a kustomization previewd cannot judge the way Kustomize will read it is refused:
//! a field not spelled exactly as Kustomize documents it, a merge key, a tag, a plugin.

use serde_yaml_ng::Value as Yaml;

/// A kustomization's fields, spelled as Kustomize documents them.
const FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "openapi",
    "namePrefix",
    "nameSuffix",
    "namespace",
    "commonLabels",
    "labels",
    "commonAnnotations",
    "patchesStrategicMerge",
    "patchesJson6902",
    "patches",
    "images",
    "replacements",
    "replicas",
    "vars",
    "resources",
    "components",
    "crds",
    "bases",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "configurations",
    "buildMetadata",
    "sortOptions",
];

/// Fields that configure Kustomize's plugins, some of which fetch URLs (a Helm chart's
/// repository, a remote resource): never from a repository.
const PLUGINS: &[&str] = &[
    "generators",
    "transformers",
    "validators",
    "helmCharts",
    "helmGlobals",
    "helmChartInflationGenerator",
];

/// Fields of list entries that name files: spelled exactly, or refused.
const FILE_FIELDS: &[&str] = &["path", "files", "envs", "env"];

/// The entries whose fields name files.
const ENTRIES_WITH_FILES: &[&str] = &[
    "patches",
    "patchesJson6902",
    "replacements",
    "configMapGenerator",
    "secretGenerator",
];

/// Checks that `parsed` (the kustomization `file`, whose text is `text`) reads the same to
/// previewd and to Kustomize.
pub fn check(file: &str, text: &[u8], parsed: &Yaml) -> Result<(), String> {
    let refuse = |why: String| Err(format!("{file}: {why}"));
    if let Some(line) = tag_line(text) {
        // The YAML parsers differ on tags: `!!binary` is a base64 string to one and its
        // decoded bytes to the other, so a path could read one way here and another there.
        return refuse(format!(
            "line {line}: a YAML tag (`!…`) is not accepted in a kustomization (Kustomize's YAML \
             reader and previewd's could read the value differently); write the value plainly"
        ));
    }
    if let Some(at) = merge_key_or_tag(parsed, "") {
        return refuse(format!(
            "{at}: YAML merge keys (<<) and tags are not accepted in a kustomization (Kustomize \
             would read what previewd cannot check); write the fields out"
        ));
    }
    let Some(fields) = parsed.as_mapping() else {
        return if parsed.is_null() {
            Ok(())
        } else {
            refuse("not a mapping of fields".into())
        };
    };
    for key in fields.keys() {
        let Some(name) = key.as_str() else {
            return refuse(format!("field {key:?} is not a name"));
        };
        if PLUGINS.iter().any(|p| p.eq_ignore_ascii_case(name)) {
            return refuse(format!(
                "{name} configures Kustomize plugins, which can fetch URLs from inside the \
                 cluster; previewd builds overlays without them (render a chart with the \
                 template's manifests.helm instead)"
            ));
        }
        if !FIELDS.contains(&name) {
            return refuse(unknown(name, FIELDS));
        }
    }
    for field in ENTRIES_WITH_FILES {
        let entries = fields.get(*field).and_then(Yaml::as_sequence);
        for (i, entry) in entries.into_iter().flatten().enumerate() {
            let Some(entry) = entry.as_mapping() else {
                continue;
            };
            for key in entry.keys().filter_map(Yaml::as_str) {
                let spelled_otherwise = FILE_FIELDS
                    .iter()
                    .any(|f| f.eq_ignore_ascii_case(key) && *f != key);
                if spelled_otherwise {
                    return refuse(format!("{field}[{i}]: {}", unknown(key, FILE_FIELDS)));
                }
            }
        }
    }
    if let Some(openapi) = fields.get("openapi").and_then(Yaml::as_mapping) {
        for key in openapi.keys().filter_map(Yaml::as_str) {
            if key != "path" && key.eq_ignore_ascii_case("path") {
                return refuse(format!("openapi: {}", unknown(key, &["path"])));
            }
        }
    }
    Ok(())
}

/// The first line (1-based) where a YAML tag may start: a `!` at the start of a node (after
/// a space, a line start, `[`, `{`, `,` or `-`). A `!` inside a word passes; one after a space
/// anywhere else (a plain or a quoted value) is refused too: a rare false alarm, the price of
/// not parsing YAML a second way.
fn tag_line(text: &[u8]) -> Option<usize> {
    let text = String::from_utf8_lossy(text);
    text.lines()
        .position(|line| {
            let mut previous = ' ';
            line.chars().any(|c| {
                let starts = c == '!' && matches!(previous, ' ' | '\t' | '[' | '{' | ',' | '-');
                previous = c;
                starts
            })
        })
        .map(|at| at + 1)
}

fn unknown(name: &str, known: &[&str]) -> String {
    match known.iter().find(|k| k.eq_ignore_ascii_case(name)) {
        Some(spelled) => format!(
            "field {name:?} is spelled {spelled:?} by Kustomize, which reads it either way; \
             previewd checks only the documented spelling, so write {spelled:?}"
        ),
        None => format!("{name:?} is not a kustomization field previewd knows"),
    }
}

/// Where in `value` (at `at`) a merge key or a tag is, if anywhere.
fn merge_key_or_tag(value: &Yaml, at: &str) -> Option<String> {
    let here = || {
        if at.is_empty() {
            ".".to_string()
        } else {
            at.to_string()
        }
    };
    match value {
        Yaml::Tagged(_) => Some(here()),
        Yaml::Mapping(fields) => fields.iter().find_map(|(key, inner)| {
            let name = key.as_str().unwrap_or("?");
            if name == "<<" || matches!(key, Yaml::Tagged(_)) {
                return Some(format!("{at}.{name}").trim_start_matches('.').to_string());
            }
            merge_key_or_tag(inner, &format!("{at}.{name}"))
                .map(|found| found.trim_start_matches('.').to_string())
        }),
        Yaml::Sequence(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| merge_key_or_tag(item, &format!("{at}[{i}]"))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(text: &str) -> Result<(), String> {
        let parsed: Yaml = serde_yaml_ng::from_str(text).unwrap();
        check("k.yaml", text.as_bytes(), &parsed)
    }

    #[test]
    fn ordinary_kustomizations_pass() {
        for text in [
            "",
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [a.yaml]\nnamePrefix: x-\n",
            "resources: [../base]\npatches:\n- path: p.yaml\n  target: {kind: Deployment}\nconfigMapGenerator:\n- name: c\n  files: [a=b.txt]\n  envs: [e.env]\nimages: [{name: web, newTag: abc}]\ncommonLabels: {Resources: x}\n",
            "kind: Component\napiVersion: kustomize.config.k8s.io/v1alpha1\nreplacements:\n- path: r.yaml\nopenapi: {path: schema.json}\n",
        ] {
            assert_eq!(judged(text), Ok(()), "{text}");
        }
    }

    #[test]
    fn what_kustomize_would_read_otherwise_is_refused() {
        for (text, said) in [
            // Go's JSON decoder matches fields without case: both are `resources` to Kustomize.
            (
                "Resources: [https://169.254.169.254/latest]\n",
                "spelled \"resources\"",
            ),
            ("RESOURCES: [x]\n", "spelled \"resources\""),
            (
                "patches:\n- Path: /etc/passwd\n",
                "patches[0]: field \"Path\"",
            ),
            (
                "configMapGenerator:\n- name: c\n  FILES: [x]\n",
                "configMapGenerator[0]: field \"FILES\"",
            ),
            (
                "openapi: {PATH: http://10.0.0.1/x}\n",
                "openapi: field \"PATH\"",
            ),
            // A merge key brings fields in that a plain reading does not see.
            ("base: &b {resources: [http://x]}\n<<: *b\n", "<<"),
            ("patches:\n- <<: {path: /etc/passwd}\n", "patches[0].<<"),
            ("resources: !!binary aGk=\n", "line 1: a YAML tag"),
            (
                "resources:\n- !!binary L2V0Yy9rdWJlcm5ldGVz\n",
                "line 2: a YAML tag",
            ),
            ("resources: [!!str x]\n", "a YAML tag"),
            // Plugins, and Helm through Kustomize, fetch what they are told to.
            (
                "generators:\n- |\n  apiVersion: builtin\n  kind: HelmChartInflationGenerator\n  repo: http://10.0.0.1/\n",
                "generators configures Kustomize plugins",
            ),
            ("transformers: [t.yaml]\n", "transformers configures"),
            (
                "helmCharts: [{name: x, repo: http://10.0.0.1}]\n",
                "helmCharts configures",
            ),
            ("HelmCharts: [{name: x}]\n", "HelmCharts configures"),
            ("frobnicate: 1\n", "not a kustomization field"),
        ] {
            let refused = judged(text).expect_err(text);
            assert!(
                refused.contains(said) && refused.starts_with("k.yaml: "),
                "{text}: {refused}"
            );
        }
    }
}
