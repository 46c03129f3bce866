//! What previewd reads of a kustomization must be what Kustomize reads (pure). Kustomize turns
//! the YAML into JSON (applying YAML 1.1 merge keys) and decodes it with Go's JSON decoder,
//! which matches field names by Unicode case folding (`RESOURCES`, and `reſources` with a long
//! s, are `resources` to it) and ignores unknown ones inside entries. A check that reads
//! `resources` but not `Resources`, or not a `<<: *base` that brings a `resources` in, would
//! let a file reach Kustomize unchecked. And Kustomize's plugins (`generators`,
//! `transformers`, `validators`, Helm charts) take configurations that fetch URLs.
//!
//! So a kustomization previewd cannot judge the way Kustomize will read it is refused: a field
//! (of the kustomization, or of an entry that names files) not spelled exactly as Kustomize
//! documents it, a merge key, a tag, a plugin. This check is the first wall, for a message that
//! names the file and the field; the kernel's walls around Kustomize (`engines::contain`) hold
//! whatever passes it.

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

/// The fields of each kind of entry that names files, spelled as Kustomize documents them: an
/// entry with any other key is refused (Go's decoder would read `fileſ` as `files`).
const ENTRY_FIELDS: &[(&str, &[&str])] = &[
    ("patches", &["path", "patch", "target", "options"]),
    ("patchesJson6902", &["path", "patch", "target"]),
    ("replacements", &["path", "source", "targets"]),
    ("configMapGenerator", GENERATOR_FIELDS),
    ("secretGenerator", GENERATOR_FIELDS),
];

/// A generator entry's fields (`type` is a Secret's; on a ConfigMap generator it names no file).
const GENERATOR_FIELDS: &[&str] = &[
    "name",
    "namespace",
    "behavior",
    "files",
    "envs",
    "env",
    "literals",
    "options",
    "type",
];

/// The fields of `openapi`.
const OPENAPI_FIELDS: &[&str] = &["path", "version"];

/// Checks that `parsed` (the kustomization `file`, whose text is `text`) reads the same to
/// previewd and to Kustomize.
pub fn check(file: &str, text: &[u8], parsed: &Yaml) -> Result<(), String> {
    check_fields(text, parsed).map_err(|why| format!("{file}: {why}"))
}

fn check_fields(text: &[u8], parsed: &Yaml) -> Result<(), String> {
    if let Some(line) = tag_line(text) {
        // The YAML parsers differ on tags: `!!binary` is a base64 string to one and its
        // decoded bytes to the other, so a path could read one way here and another there.
        return Err(format!(
            "line {line}: a YAML tag (`!…`) is not accepted in a kustomization (Kustomize's YAML \
             reader and previewd's could read the value differently); write the value plainly"
        ));
    }
    if let Some(at) = merge_key_or_tag(parsed, "") {
        return Err(format!(
            "{at}: YAML merge keys (<<) and tags are not accepted in a kustomization (Kustomize \
             would read what previewd cannot check); write the fields out"
        ));
    }
    let Some(fields) = parsed.as_mapping() else {
        return if parsed.is_null() {
            Ok(())
        } else {
            Err("not a mapping of fields".into())
        };
    };
    for key in fields.keys() {
        let Some(name) = key.as_str() else {
            return Err(format!("field {key:?} is not a name"));
        };
        if PLUGINS.iter().any(|p| go_fold(p) == go_fold(name)) {
            return Err(format!(
                "{name} configures Kustomize plugins, which can fetch URLs from inside the \
                 cluster; previewd builds overlays without them (render a chart with the \
                 template's manifests.helm instead)"
            ));
        }
        exactly_one_of(name, FIELDS)?;
    }
    for (field, known) in ENTRY_FIELDS {
        let entries = fields.get(*field).and_then(Yaml::as_sequence);
        for (i, entry) in entries.into_iter().flatten().enumerate() {
            if let Some(entry) = entry.as_mapping() {
                keys_among(entry, known).map_err(|why| format!("{field}[{i}]: {why}"))?;
            }
        }
    }
    if let Some(openapi) = fields.get("openapi").and_then(Yaml::as_mapping) {
        keys_among(openapi, OPENAPI_FIELDS).map_err(|why| format!("openapi: {why}"))?;
    }
    Ok(())
}

/// Every key of `entry` is one of `known`, spelled exactly.
fn keys_among(entry: &serde_yaml_ng::Mapping, known: &[&str]) -> Result<(), String> {
    for key in entry.keys() {
        let Some(name) = key.as_str() else {
            return Err(format!("field {key:?} is not a name"));
        };
        exactly_one_of(name, known)?;
    }
    Ok(())
}

fn exactly_one_of(name: &str, known: &[&str]) -> Result<(), String> {
    if known.contains(&name) {
        Ok(())
    } else {
        Err(unknown(name, known))
    }
}

/// `name` as Go's JSON decoder compares field names (`encoding/json`'s folding): ASCII letters
/// in one case, and the two non-ASCII letters whose Unicode simple case folding reaches ASCII,
/// the long s (U+017F, an `s`) and the Kelvin sign (U+212A, a `k`). Two names are the same
/// field to Kustomize exactly when their folds are equal.
fn go_fold(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '\u{17f}' => 'S',
            '\u{212a}' => 'K',
            c => c.to_ascii_uppercase(),
        })
        .collect()
}

/// The first line (1-based) where a YAML tag may start: any `!` that does not follow a letter,
/// a digit or `_` (a tag starts a node after a space, a line start, `[`, `{`, `,`, `-`, `:`,
/// `?` or a quote in flow style, …). A `!` inside a word passes; one elsewhere in a value is
/// refused too: a rare false alarm, the price of not parsing YAML a second way.
fn tag_line(text: &[u8]) -> Option<usize> {
    let text = String::from_utf8_lossy(text);
    text.lines()
        .position(|line| {
            let mut previous = ' ';
            line.chars().any(|c| {
                let starts = c == '!' && !(previous.is_alphanumeric() || previous == '_');
                previous = c;
                starts
            })
        })
        .map(|at| at + 1)
}

fn unknown(name: &str, known: &[&str]) -> String {
    match known.iter().find(|k| go_fold(k) == go_fold(name)) {
        Some(spelled) => format!(
            "field {name:?} is spelled {spelled:?} by Kustomize, which reads it either way; \
             previewd checks only the documented spelling, so write {spelled:?}"
        ),
        None => format!(
            "{name:?} is not a kustomization field previewd knows here (it knows {})",
            known.join(", ")
        ),
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
            // Go folds the long s and the Kelvin sign to ASCII letters: the same fields to it.
            (
                "re\u{17f}ources: [http://10.0.0.1/x]\n",
                "spelled \"resources\"",
            ),
            ("\u{212a}ind: Kustomization\n", "spelled \"kind\""),
            (
                "configMapGenerator:\n- name: c\n  file\u{17f}: [http://10.0.0.1/x]\n",
                "configMapGenerator[0]: field \"file\u{17f}\" is spelled \"files\"",
            ),
            // Every key of an entry that names files is one Kustomize documents.
            (
                "patches:\n- path: p.yaml\n  frobnicate: 1\n",
                "patches[0]: \"frobnicate\" is not a kustomization field",
            ),
            (
                "secretGenerator:\n- name: s\n  kvSources: [{name: x}]\n",
                "secretGenerator[0]: \"kvSources\"",
            ),
            (
                "openapi: {path: s.json, url: http://x}\n",
                "openapi: \"url\"",
            ),
            // A tag after a colon in flow style, or after a quote, is a tag all the same.
            ("{\"resources\":!!seq [x]}\n", "line 1: a YAML tag"),
            ("resources: [\"a\",!!str b]\n", "line 1: a YAML tag"),
        ] {
            let refused = judged(text).expect_err(text);
            assert!(
                refused.contains(said) && refused.starts_with("k.yaml: "),
                "{text}: {refused}"
            );
        }
    }
}
