//! The layers of `src/` stay layers: every `crate::` path in a layer's files names only that
//! layer or a layer below it, the folders import each other without a circle, and so do the
//! files, across the whole crate. The order is
//! the one `src/lib.rs` and `docs/architecture.md` describe; a new folder must be placed in it.
//!
//! Reads the source text (no build needed); comments are skipped, so a doc link may point
//! anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each layer folder with its rank: a layer may import layers of lower rank only. Layers of the
/// same rank (the webhook side and the lifecycle) may not import each other.
const LAYERS: &[(&str, u8)] = &[
    ("model", 0),
    ("cluster", 1),
    ("engines", 1),
    ("database", 1),
    ("forge", 2),
    ("plan", 2),
    ("webhook", 3),
    ("lifecycle", 3),
    ("gate", 3),
    ("reconcile", 4),
    ("runtime", 5),
    ("sandbox", 6),
];

fn rank(layer: &str) -> Option<u8> {
    LAYERS
        .iter()
        .find(|(name, _)| *name == layer)
        .map(|(_, r)| *r)
}

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments (line comments and doc comments).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string literal (a URL) is rare in this crate; cutting the line
            // there can only hide an import, and imports never share a line with a URL.
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named by `crate::…` paths in `code`, including `crate::{a, b::c}`.
fn crate_imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        // `previewd::crate::` never appears; skip identifiers that merely end in `crate`.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inside = &group[..group.find('}').unwrap_or(group.len())];
            for item in inside.split(',') {
                let name = leading_ident(item.trim());
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        } else {
            let name = leading_ident(rest);
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

fn leading_ident(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// folder → folders its files import (crate-root items such as `install_crypto_provider` are
/// left out: they belong to no layer).
fn folder_imports() -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src");
        let mut parts = relative.components();
        let folder = parts
            .next()
            .expect("a path")
            .as_os_str()
            .to_string_lossy()
            .to_string();
        if parts.next().is_none() {
            continue; // lib.rs, main.rs: the crate root and the CLI may use every layer
        }
        if folder == "bin" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        for target in crate_imports(&code_of(&text)) {
            if rank(&target).is_none() || target == folder {
                continue;
            }
            graph
                .entry(folder.clone())
                .or_default()
                .entry(target)
                .or_default()
                .push(relative.display().to_string());
        }
    }
    graph
}

/// The entries directly in `src/`: (name, is a folder).
fn top_of_src() -> Vec<(String, bool)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    std::fs::read_dir(&src)
        .expect("read src")
        .map(|entry| {
            let path = entry.expect("dir entry").path();
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .to_string();
            (name, path.is_dir())
        })
        .collect()
}

#[test]
fn src_holds_only_the_crate_root_the_cli_and_layer_folders() {
    for (name, is_dir) in top_of_src() {
        assert!(
            is_dir || name == "lib.rs" || name == "main.rs",
            "src/{name} is a module outside every layer: put it in the folder of its layer"
        );
    }
}

#[test]
fn every_folder_of_src_is_a_placed_layer() {
    for (name, _) in top_of_src().into_iter().filter(|(_, is_dir)| *is_dir) {
        assert!(
            name == "bin" || rank(&name).is_some(),
            "src/{name}/ is not in the layer list of tests/integration/architecture.rs (and docs/architecture.md)"
        );
    }
}

#[test]
fn layers_import_only_layers_below_them() {
    let mut wrong = Vec::new();
    for (folder, targets) in folder_imports() {
        let own = rank(&folder).unwrap_or(u8::MAX);
        for (target, files) in targets {
            let theirs = rank(&target).unwrap_or(u8::MAX);
            if theirs >= own {
                wrong.push(format!(
                    "{folder}/ imports {target}/ in {}",
                    files.join(", ")
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that point up or sideways:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_webhook_side_never_imports_the_reconciler() {
    let graph = folder_imports();
    let webhook = graph.get("webhook").cloned().unwrap_or_default();
    assert!(
        !webhook.contains_key("reconcile"),
        "webhook/ imports reconcile/ in {:?}",
        webhook.get("reconcile")
    );
}

#[test]
fn folders_import_each_other_without_a_circle() {
    let graph = folder_imports();
    let edges: BTreeMap<&str, Vec<&str>> = graph
        .iter()
        .map(|(from, to)| (from.as_str(), to.keys().map(String::as_str).collect()))
        .collect();
    fn visit<'a>(
        node: &'a str,
        edges: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(start) = path.iter().position(|n| *n == node) {
            let mut circle = path[start..].to_vec();
            circle.push(node);
            return Some(circle);
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for next in edges.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, edges, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        if let Some(circle) = visit(node, &edges, &mut Vec::new(), &mut done) {
            panic!("an import circle: {}", circle.join(" → "));
        }
    }
}

#[test]
fn the_sibling_reader_follows_super_and_crate_paths_and_nested_groups() {
    let code = "use super::{a::{b, c}, d};\nuse crate::plan::e::f;\nlet x = super::super::g;";
    let mut found = modules_after(code, "super::");
    found.extend(modules_after(code, "crate::plan::"));
    assert_eq!(found, ["a", "d", "super", "e"]);
}

#[test]
fn the_reader_finds_grouped_and_inline_imports_and_skips_comments() {
    let code = code_of(
        "use crate::{model::crd, cluster};\nlet x = crate::forge::github::sign(a);\n// crate::sandbox in a comment\n/// [`crate::runtime`]\n",
    );
    let found: Vec<String> = crate_imports(&code).into_iter().collect();
    assert_eq!(found, ["cluster", "forge", "model"]);
}

/// The arrows `a --> b` of the first diagram of docs/architecture.md (the layers).
fn drawn_arrows() -> Vec<(String, String)> {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .expect("docs/architecture.md");
    let diagram = page
        .split("```mermaid")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a mermaid diagram");
    diagram
        .lines()
        .filter_map(|line| line.trim().split_once("-->"))
        .map(|(from, to)| (from.trim().to_string(), to.trim().to_string()))
        .collect()
}

/// What docs/architecture.md draws is what the code does: each arrow of its layer diagram is
/// an import of the code (an arrow the code does not have misleads the reader about who may
/// call whom).
#[test]
fn every_arrow_the_architecture_page_draws_is_an_import() {
    let imports = folder_imports();
    let arrows = drawn_arrows();
    assert!(arrows.len() >= 10, "the diagram was not found: {arrows:?}");
    for (from, to) in arrows {
        let imported = imports
            .get(&from)
            .is_some_and(|targets| targets.contains_key(&to));
        assert!(
            imported,
            "docs/architecture.md draws {from} --> {to}, but no file of src/{from}/ imports crate::{to}"
        );
    }
}

/// Within each folder, file → sibling modules it imports, through `super::` or through
/// `crate::<the folder's path>::` (test code left out: a `tests.rs` file, and each item under
/// a `#[cfg(test)]`). A folder's `mod.rs` counts as the folder's own file.
fn sibling_imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let folder = file.parent().expect("a folder");
        let stem = file
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .to_string();
        if matches!(stem.as_str(), "tests" | "lib" | "main") || folder == src {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        let code = code_of(&without_test_code(&text));
        let name = |module: &str| {
            let path = folder.join(module);
            path.strip_prefix(&src)
                .expect("under src")
                .display()
                .to_string()
        };
        // `mod.rs` speaks for the folder: its siblings are the folder's own files.
        let (own, siblings_of) = match stem.as_str() {
            "mod" => (name("mod"), folder.to_path_buf()),
            _ => (name(&stem), folder.to_path_buf()),
        };
        let module_path = folder
            .strip_prefix(&src)
            .expect("under src")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().to_string())
            .collect::<Vec<_>>()
            .join("::");
        let mut named = modules_after(&code, "super::");
        named.extend(modules_after(&code, &format!("crate::{module_path}::")));
        for target in named {
            let sibling = siblings_of.join(format!("{target}.rs")).exists()
                || siblings_of.join(&target).is_dir();
            if sibling && target != stem {
                graph.entry(own.clone()).or_default().insert(name(&target));
            }
        }
    }
    graph
}

/// The module names right after each `prefix` in `code` (`prefix::a`, `prefix::{a, b::c}`),
/// where the prefix is not the tail of a longer path.
fn modules_after(code: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                // Top-level items of the group only: depth counted over nested braces.
                let mut depth = 0;
                let mut item = String::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            found.push(leading_ident(item.trim()));
                            item.clear();
                            continue;
                        }
                        _ => {}
                    }
                    item.push(c);
                }
                found.push(leading_ident(item.trim()));
            }
            None => found.push(leading_ident(rest)),
        }
    }
    found
}

#[test]
fn files_import_their_siblings_without_a_circle() {
    let graph = sibling_imports();
    assert!(
        graph.len() > 20,
        "only {} files import a sibling: is the reader broken?",
        graph.len()
    );
    let mut circles = Vec::new();
    for (from, targets) in &graph {
        for to in targets {
            if graph.get(to).is_some_and(|back| back.contains(from)) && from < to {
                circles.push(format!("{from} ⇄ {to}"));
            }
        }
    }
    // Longer circles: any file that reaches itself again.
    fn reaches(
        from: &str,
        goal: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(from).into_iter().flatten() {
            if next == goal {
                return true;
            }
            if seen.insert(next.clone()) && reaches(next, goal, graph, seen) {
                return true;
            }
        }
        false
    }
    for file in graph.keys() {
        if reaches(file, file, &graph, &mut BTreeSet::new())
            && !circles.iter().any(|c| c.contains(file.as_str()))
        {
            circles.push(format!("{file} reaches itself"));
        }
    }
    assert!(
        circles.is_empty(),
        "files that import each other:\n{}",
        circles.join("\n")
    );
}

/// `text` without its test code: each item under a `#[cfg(test)]` attribute (a `mod x;` line,
/// or a block to its closing brace at the attribute's indentation) is left out, and only it.
fn without_test_code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = Vec::with_capacity(lines.len());
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        if line.trim() != "#[cfg(test)]" {
            kept.push(line);
            at += 1;
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let item = at + 1;
        let opens_block = lines.get(item).is_some_and(|l| l.trim_end().ends_with('{'));
        at = match opens_block {
            true => {
                let close = format!("{}}}", " ".repeat(indent));
                let end = lines[item + 1..].iter().position(|l| l.starts_with(&close));
                end.map_or(lines.len(), |end| item + 1 + end + 1)
            }
            false => item + 1,
        };
    }
    kept.join("\n")
}

/// Every path named after `crate::` or `super::` (as many `super::` as written) in `code`,
/// with groups expanded: `crate::a::{b::{c, d}, e}` gives `crate::a::b::c`, `crate::a::b::d`
/// and `crate::a::e`. Each path as its segments, starting with `crate` or `super`.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in ["crate::", "super::"] {
        for (at, _) in code.match_indices(start) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            expand(&code[at..], Vec::new(), &mut found);
        }
    }
    found
}

/// Expands the path at the start of `text` (after the segments in `prefix`) into `out`.
fn expand(text: &str, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut rest = text;
    loop {
        let name = leading_ident(rest);
        if name.is_empty() {
            break;
        }
        prefix.push(name.clone());
        rest = &rest[name.len()..];
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(item.trim(), prefix.clone(), out);
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            expand(item.trim(), prefix.clone(), out);
            return;
        }
    }
    out.push(prefix);
}

/// The source file a module path leads to: the deepest of its prefixes that is a file
/// (`a/b.rs`) or a folder's `mod.rs`, as a path under src/ without `.rs`.
fn file_of(src: &Path, segments: &[String]) -> Option<String> {
    let mut deepest = None;
    let mut dir = src.to_path_buf();
    for segment in segments {
        if dir.join(format!("{segment}.rs")).exists() {
            deepest = Some(dir.join(segment));
            break;
        }
        if dir.join(segment).join("mod.rs").exists() {
            dir = dir.join(segment);
            deepest = Some(dir.join("mod"));
            continue;
        }
        break;
    }
    deepest.map(|path| {
        path.strip_prefix(src)
            .expect("under src")
            .display()
            .to_string()
    })
}

/// File → files it imports, across the whole crate (test code left out, as for siblings).
fn file_imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let module = file
            .strip_prefix(&src)
            .expect("under src")
            .with_extension("");
        let own = module.display().to_string();
        let stem = module.file_name().map(|n| n.to_string_lossy().to_string());
        if matches!(stem.as_deref(), Some("tests" | "lib" | "main")) || own.starts_with("bin/") {
            continue;
        }
        // The module path of this file: its folders, and its name unless it is a `mod.rs`.
        let mut here: Vec<String> = module
            .components()
            .map(|c| c.as_os_str().to_string_lossy().to_string())
            .collect();
        if stem.as_deref() == Some("mod") {
            here.pop();
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        let code = code_of(&without_test_code(&text));
        for path in paths_in(&code) {
            let mut absolute = here.clone();
            let mut rest = path.as_slice();
            if rest.first().is_some_and(|s| s == "crate") {
                absolute.clear();
                rest = &rest[1..];
            }
            while rest.first().is_some_and(|s| s == "super") {
                absolute.pop();
                rest = &rest[1..];
            }
            absolute.extend(rest.iter().cloned());
            if let Some(target) = file_of(&src, &absolute)
                && target != own
            {
                graph.entry(own.clone()).or_default().insert(target);
            }
        }
    }
    graph
}

#[test]
fn no_files_import_each_other_in_a_circle_anywhere_in_the_crate() {
    let graph = file_imports();
    assert!(
        graph.len() > 60,
        "only {} files import another: is the reader broken?",
        graph.len()
    );
    let circles = circles_in(&graph);
    assert!(
        circles.is_empty(),
        "files that import each other:\n{}",
        circles.join("\n")
    );
}

/// Every circle of `graph`, once each, as `a → b → … → a`.
fn circles_in(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn path_back(
        from: &str,
        goal: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        seen: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        for next in graph.get(from).into_iter().flatten() {
            if next == goal {
                return Some(vec![next.clone()]);
            }
            if seen.insert(next.clone())
                && let Some(mut rest) = path_back(next, goal, graph, seen)
            {
                rest.insert(0, next.clone());
                return Some(rest);
            }
        }
        None
    }
    let mut circles: Vec<String> = Vec::new();
    let mut in_a_circle: BTreeSet<String> = BTreeSet::new();
    for file in graph.keys() {
        if in_a_circle.contains(file) {
            continue;
        }
        if let Some(path) = path_back(file, file, graph, &mut BTreeSet::new()) {
            in_a_circle.extend(path.iter().cloned());
            circles.push(format!("{file} → {}", path.join(" → ")));
        }
    }
    circles
}

#[test]
fn the_file_reader_expands_groups_and_climbs_super() {
    let code = "use crate::forge::{client::{A, B}, github};\nuse super::super::model::crd::X;";
    let paths: Vec<String> = paths_in(code).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        paths,
        [
            "crate::forge::client::A",
            "crate::forge::client::B",
            "crate::forge::github",
            "super::super::model::crd::X"
        ]
    );
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let to = |path: &[&str]| {
        file_of(
            &src,
            &path.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        to(&["forge", "client", "ForgeClient"]).as_deref(),
        Some("forge/client")
    );
    assert_eq!(
        to(&["forge", "github", "parse"]).as_deref(),
        Some("forge/github/mod")
    );
    assert_eq!(to(&["forge", "EventKind"]).as_deref(), Some("forge/mod"));
    assert_eq!(to(&["nothing"]), None);
}

/// The most lines a function of `src/` (test code left out) may take, signature to closing
/// brace: one screen, so that a function can be read whole.
const MOST_LINES_PER_FUNCTION: usize = 80;

/// (lines, file, function) of each function of `text` longer than `most` lines, found by
/// indentation as rustfmt lays code out: from a line starting `fn` (after `pub`, `async`,
/// `const`) to the first line back at its indentation that closes a brace.
fn long_functions(file: &str, text: &str, most: usize) -> Vec<(usize, String, String)> {
    let code = without_test_code(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let words: Vec<&str> = trimmed
            .split_whitespace()
            .skip_while(|w| w.starts_with("pub") || *w == "async" || *w == "const")
            .collect();
        let is_fn = words.first() == Some(&"fn");
        let opens = lines[at..]
            .iter()
            .position(|l| l.trim_end().ends_with('{') || l.trim_end().ends_with(';'));
        match (is_fn, opens) {
            (true, Some(offset)) if lines[at + offset].trim_end().ends_with('{') => {
                let close = format!("{}}}", " ".repeat(indent));
                let body_start = at + offset + 1;
                // No closing brace found: reported as longer than any bound, never passed by.
                let length = lines[body_start..]
                    .iter()
                    .position(|l| l.starts_with(&close))
                    .map_or(usize::MAX, |end| body_start + end - at + 1);
                if length > most {
                    let name = words
                        .get(1)
                        .map_or("", |w| w.split(['(', '<']).next().unwrap_or(""));
                    found.push((length, file.to_string(), name.to_string()));
                }
                at = body_start;
            }
            _ => at += 1,
        }
    }
    found
}

#[test]
fn no_function_of_src_is_longer_than_a_screen() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let mut long = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read source");
        let name = file
            .strip_prefix(&src)
            .expect("under src")
            .display()
            .to_string();
        long.extend(long_functions(&name, &text, MOST_LINES_PER_FUNCTION));
    }
    assert!(
        long.is_empty(),
        "functions over {MOST_LINES_PER_FUNCTION} lines (split them by what each part does): {long:?}"
    );
}

#[test]
fn test_code_is_left_out_item_by_item_and_the_code_after_it_is_read() {
    let text = "use a;\n#[cfg(test)]\nmod corpus;\nuse b;\n#[cfg(test)]\nmod tests {\n    use c;\n}\nuse d;\n";
    assert_eq!(without_test_code(text), "use a;\nuse b;\nuse d;");
}

#[test]
fn the_length_reader_measures_from_fn_to_its_closing_brace() {
    let body = "    let x = 1;\n".repeat(5);
    let text = format!("pub async fn long(a: u8) -> u8 {{\n{body}}}\n\nfn short() {{}}\n");
    assert_eq!(
        long_functions("f.rs", &text, 6),
        [(7, "f.rs".to_string(), "long".to_string())]
    );
    assert!(long_functions("f.rs", &text, 7).is_empty());
}
