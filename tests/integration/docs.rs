//! What docs/ names exists (issue 36 §4): every repository path a page writes in backticks
//! (`src/engines/worker.rs`, `templates/web-chart/`, or a file named from its layer as
//! architecture.md does, `forge/github/webhook.rs`) and every relative link. A page that sends
//! a newcomer to a file that was moved or never written fails here, not on their machine. And
//! every test (or function) a page cites by name, as the evidence for a sentence, exists
//! (issue 38 §1): a renamed or deleted test cannot leave its sentence behind unproven.

use std::path::{Path, PathBuf};

/// The top-level folders a named path starts with (the repository's layout).
const TOP_LEVEL: &[&str] = &[
    "src/",
    "tests/",
    "charts/",
    "templates/",
    "crds/",
    "docs/",
    ".ci/",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every page of docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    pages
}

/// The extensions of the files a page may name from inside a layer (`plan/render.rs`).
const FILE_ENDINGS: &[&str] = &[".rs", ".md", ".yaml", ".json", ".py", ".toml", ".sh"];

/// The repository paths in backticks on `text`: tokens that start with a top-level folder, or
/// that hold a `/` and end like a file, without a `:line` or `#anchor` suffix and without glob
/// or placeholder characters.
fn named_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|token| !token.contains(['*', '<', '>', ' ', '\n', '{', '$']))
        .map(|token| token.split([':', '#']).next().unwrap_or_default())
        .filter(|path| {
            let top = TOP_LEVEL.iter().any(|top| path.starts_with(top));
            let file = path.contains('/')
                && !path.starts_with(['/', '.', '~'])
                && FILE_ENDINGS.iter().any(|ending| path.ends_with(ending));
            top || file
        })
        .map(str::to_string)
        .collect()
}

/// Where a named path may be: from the repository's root, from `src/` or `tests/`, or from
/// one of `src/`'s layers (architecture.md names `plan/hooks.rs` from `src/reconcile/`).
fn bases() -> Vec<PathBuf> {
    let mut bases = vec![root(), root().join("src"), root().join("tests")];
    for entry in std::fs::read_dir(root().join("src")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            bases.push(path);
        }
    }
    bases
}

/// The relative targets of markdown links on `text` (`[words](target)`), without anchors.
fn linked_paths(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|target| !target.contains("://") && !target.starts_with('#'))
        .filter(|target| !target.starts_with("mailto:"))
        .map(|target| target.split('#').next().unwrap_or_default().to_string())
        .filter(|target| !target.is_empty())
        .collect()
}

#[test]
fn every_path_the_docs_name_exists() {
    let bases = bases();
    let mut missing = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let shown = page.strip_prefix(root()).unwrap().display().to_string();
        for path in named_paths(&text) {
            checked += 1;
            if !bases.iter().any(|base| base.join(&path).exists()) {
                missing.push(format!("{shown}: `{path}`"));
            }
        }
        let folder = page.parent().unwrap_or(Path::new("."));
        for target in linked_paths(&text) {
            checked += 1;
            if !folder.join(&target).exists() {
                missing.push(format!("{shown}: link ({target})"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: is the reader broken?"
    );
    assert!(
        missing.is_empty(),
        "named in the docs, not in the repository:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_reader_finds_named_and_linked_paths_and_skips_patterns() {
    let text = "see `src/main.rs:12`, `docs/a.md#x`, `templates/<name>/`, `docs/**`, \
                `cargo test`, `plan/hooks.rs`, `previewd.dev/`, `/etc/passwd`, \
                [guide](getting-started.md#run) and [site](https://x.dev/a.md)";
    assert_eq!(
        named_paths(text),
        ["src/main.rs", "docs/a.md", "plan/hooks.rs"]
    );
    assert_eq!(linked_paths(text), ["getting-started.md"]);
}

/// The function names in backticks on `text`: snake_case identifiers of four words or more
/// (`a_request_wakes_a_sleeping_environment`, `render_and_plan` is too short to be told from a
/// field), leaving out metric names (`previewd_…`).
fn cited_functions(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|token| {
            let words: Vec<&str> = token.split('_').collect();
            words.len() >= 4
                && words.iter().all(|w| {
                    !w.is_empty()
                        && w.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                })
                && token.starts_with(|c: char| c.is_ascii_lowercase())
                && !token.starts_with("previewd_")
        })
        .map(str::to_string)
        .collect()
}

/// The name of every test (a `fn` under `#[test]` or `#[tokio::test]`) in the Rust files
/// under `folder`.
fn defined_tests(folder: &Path, into: &mut std::collections::HashSet<String>) {
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            defined_tests(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.extend(tests_in(&std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// The test functions of one Rust file: a `fn` whose attributes (the lines right above it,
/// comments between them allowed) include a test attribute.
fn tests_in(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut under_test_attribute = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with("#[test]") || line.starts_with("#[tokio::test") {
            under_test_attribute = true;
        } else if let Some(rest) = line
            .strip_prefix("async fn ")
            .or_else(|| line.strip_prefix("fn "))
        {
            if under_test_attribute {
                let name = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_');
                found.push(name.collect());
            }
            under_test_attribute = false;
        } else if !(line.starts_with("#[") || line.starts_with("//") || line.is_empty()) {
            under_test_attribute = false;
        }
    }
    found
}

#[test]
fn only_functions_under_a_test_attribute_are_tests() {
    let text = "#[test]\nfn a_b_c_d() {}\nfn helper_not_a_test() {}\n#[tokio::test(flavor = \"multi_thread\")]\n// why\nasync fn e_f_g_h() {}\n#[derive(Debug)]\nstruct S;\nfn after_a_struct() {}";
    assert_eq!(tests_in(text), ["a_b_c_d", "e_f_g_h"]);
}

/// Names the docs cite that are other projects', not previewd's functions.
const OUTSIDE_NAMES: &[&str] = &[
    "nginx_ingress_controller_requests",
    "apiserver_request_duration_seconds",
];

#[test]
fn every_test_the_docs_cite_exists() {
    let mut defined = std::collections::HashSet::new();
    defined_tests(&root().join("src"), &mut defined);
    defined_tests(&root().join("tests"), &mut defined);
    let mut missing = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let shown = page.strip_prefix(root()).unwrap().display().to_string();
        for name in cited_functions(&text) {
            checked += 1;
            if !defined.contains(&name) && !OUTSIDE_NAMES.contains(&name.as_str()) {
                missing.push(format!("{shown}: `{name}`"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} tests cited: is the reader broken?"
    );
    assert!(
        missing.is_empty(),
        "cited in the docs, no test of that name in src/ or tests/:\n{}",
        missing.join("\n")
    );
}

#[test]
fn cited_names_are_told_from_fields_and_metrics() {
    let text = "`a_request_wakes_a_sleeping_environment`, `render_and_plan`, `previewd_gc_sleeps_total`, \
                `spec.lifecycle.idle_timeout`, `src/gate/server.rs`, `Not_a_name_here`, `two_words`";
    assert_eq!(
        cited_functions(text),
        ["a_request_wakes_a_sleeping_environment"]
    );
}
