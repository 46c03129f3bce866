//! Commits that are not deployed, told by the delivery alone (pure): `[skip preview]` in the
//! head commit's message, or a push whose changed files the template's `triggers.paths` /
//! `triggers.ignorePaths` leave out ("only docs/ changed"). The intake records the verdict in
//! the environment's `spec.skip`; the reconciler then keeps the commit deployed before.
//!
//! A delivery that does not say (GitHub's `pull_request` carries neither files nor message; a
//! new or force-pushed branch lists its files only in part) never skips: when in doubt, deploy.
//!
//! Messages and file names come from the PR author and end up in the PR comment: they are
//! shown in code spans without backticks or control characters, and short.

use crate::model::crd::{SkippedCommit, Triggers};

/// What a commit message may say to skip its preview (any case).
pub const MARKERS: [&str; 2] = ["[skip preview]", "[preview skip]"];

/// At most this many globs of each list are used (a template with more matches on these).
pub const MAX_GLOBS: usize = 64;

/// A glob longer than this matches nothing.
pub const MAX_GLOB_LENGTH: usize = 256;

/// Whether the commit `head_sha` is skipped, from what the delivery says of it (`files`: every
/// file the push changed, `None` if unknown; `message`: the head commit's message).
pub fn skip(
    triggers: &Triggers,
    head_sha: &str,
    files: Option<&[String]>,
    message: Option<&str>,
) -> Option<SkippedCommit> {
    let reason = message
        .and_then(marker_in)
        .map(|marker| format!("its message says `{marker}`"))
        .or_else(|| files.and_then(|files| left_out(triggers, files)))?;
    Some(SkippedCommit {
        sha: head_sha.to_string(),
        reason,
    })
}

fn marker_in(message: &str) -> Option<&'static str> {
    let lower = message.to_lowercase();
    MARKERS.into_iter().find(|marker| lower.contains(marker))
}

/// Why `files` need no preview (`only docs/ changed`), or `None` if one of them counts. No
/// path filter, or no file at all (an empty commit, pushed to deploy again): they count.
fn left_out(triggers: &Triggers, files: &[String]) -> Option<String> {
    if triggers.paths.is_empty() && triggers.ignore_paths.is_empty() || files.is_empty() {
        return None;
    }
    let counts = |file: &String| {
        let wanted = triggers.paths.is_empty() || any_matches(&triggers.paths, file);
        wanted && !any_matches(&triggers.ignore_paths, file)
    };
    if files.iter().any(counts) {
        return None;
    }
    Some(match (common_folder(files), files) {
        (Some(folder), _) => format!("only `{}/` changed", shown(folder)),
        (None, [file]) => format!("only `{}` changed", shown(file)),
        (None, _) => format!(
            "none of the {} changed files is one `triggers.paths` / `ignorePaths` deploy",
            files.len()
        ),
    })
}

fn any_matches(globs: &[String], file: &str) -> bool {
    globs
        .iter()
        .take(MAX_GLOBS)
        .any(|glob| path_matches(glob, file))
}

/// The first folder every file is in, if they share one (`docs` for `docs/a.md`, `docs/b/c.md`).
fn common_folder(files: &[String]) -> Option<&str> {
    let first = files.first()?.split_once('/')?.0;
    files
        .iter()
        .all(|file| {
            file.split_once('/')
                .is_some_and(|(folder, _)| folder == first)
        })
        .then_some(first)
}

/// A name from the repository as shown in a code span of the PR comment.
fn shown(name: &str) -> String {
    name.chars()
        .filter(|c| !c.is_control() && *c != '`')
        .take(100)
        .collect()
}

/// Whether repository path `path` matches `glob`: `*` and `?` stay within a folder, a `**`
/// folder stands for any number of folders (`docs/**`, `**/*.md`), as in GitHub Actions'
/// `paths` and `.gitignore`. Folder by folder, without backtracking over the whole path, so a
/// template's glob cannot make a long path costly.
pub fn path_matches(glob: &str, path: &str) -> bool {
    if glob.len() > MAX_GLOB_LENGTH {
        return false;
    }
    let pattern: Vec<&str> = glob.trim_start_matches('/').split('/').collect();
    let parts: Vec<&str> = path.split('/').collect();
    // `rest[j]`: the pattern from folder `i + 1` on matches `parts[j..]`.
    let mut rest = vec![false; parts.len() + 1];
    if let Some(last) = rest.last_mut() {
        *last = true;
    }
    for segment in pattern.iter().rev() {
        let mut here = vec![false; parts.len() + 1];
        for j in (0..=parts.len()).rev() {
            here[j] = match (*segment, parts.get(j)) {
                ("**", Some(_)) => rest[j] || here[j + 1],
                ("**", None) => rest[j],
                (segment, Some(part)) => rest[j + 1] && super::glob_matches(segment, part),
                (_, None) => false,
            };
        }
        rest = here;
    }
    rest[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn triggers(paths: &[&str], ignore: &[&str]) -> Triggers {
        Triggers {
            paths: paths.iter().map(|p| p.to_string()).collect(),
            ignore_paths: ignore.iter().map(|p| p.to_string()).collect(),
            ..Default::default()
        }
    }

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn globs_match_folder_by_folder() {
        let cases = [
            ("docs/**", "docs/guide.md", true),
            ("docs/**", "docs/a/b/c.png", true),
            ("docs/**", "src/docs/x", false),
            ("**/*.md", "README.md", true),
            ("**/*.md", "docs/deep/x.md", true),
            ("**/*.md", "docs/x.mdx", false),
            ("*.md", "README.md", true),
            ("*.md", "docs/README.md", false),
            ("src/*.rs", "src/main.rs", true),
            ("src/*.rs", "src/a/main.rs", false),
            ("src/**/test_?.py", "src/a/b/test_1.py", true),
            ("/charts/**", "charts/app/values.yaml", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
        ];
        for (glob, path, expected) in cases {
            assert_eq!(path_matches(glob, path), expected, "{glob} ~ {path}");
        }
    }

    #[test]
    fn a_hostile_glob_or_path_stays_cheap() {
        let glob = format!("{}b", "*a".repeat(100));
        let path = "a".repeat(5000);
        let started = std::time::Instant::now();
        assert!(!path_matches(&glob, &path));
        let deep = format!("{}x", "**/".repeat(80));
        assert!(!path_matches(&deep, &"d/".repeat(2000)));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert!(!path_matches(&"*".repeat(MAX_GLOB_LENGTH + 1), "a"));
    }

    #[test]
    fn a_docs_only_push_is_skipped_and_says_where() {
        let docs = triggers(&[], &["docs/**", "**/*.md"]);
        let skipped = skip(
            &docs,
            "abc",
            Some(&files(&["docs/a.md", "docs/img/b.png"])),
            None,
        );
        assert_eq!(skipped.unwrap().reason, "only `docs/` changed");
        let one = skip(&docs, "abc", Some(&files(&["README.md"])), None);
        assert_eq!(one.unwrap().reason, "only `README.md` changed");
        let mixed = skip(
            &docs,
            "abc",
            Some(&files(&["README.md", "CHANGES.md"])),
            None,
        );
        assert!(
            mixed
                .unwrap()
                .reason
                .starts_with("none of the 2 changed files")
        );
        // One file that counts, an unknown list, an empty commit: deployed.
        let code = files(&["docs/a.md", "src/main.rs"]);
        assert_eq!(skip(&docs, "abc", Some(&code), None), None);
        assert_eq!(skip(&docs, "abc", None, None), None);
        assert_eq!(skip(&docs, "abc", Some(&[]), None), None);
        // `paths`: only what it names counts.
        let src = triggers(&["src/**"], &[]);
        assert_eq!(skip(&src, "abc", Some(&code), None), None);
        let skipped = skip(&src, "abc", Some(&files(&["charts/x.yaml"])), None);
        assert_eq!(skipped.unwrap().reason, "only `charts/` changed");
        // No filter: nothing is skipped for its files.
        assert_eq!(
            skip(
                &triggers(&[], &[]),
                "abc",
                Some(&files(&["docs/a.md"])),
                None
            ),
            None
        );
    }

    #[test]
    fn the_message_marker_skips_whatever_changed() {
        let none = triggers(&[], &[]);
        for message in ["Fix typo [skip preview]", "wip\n\n[PREVIEW SKIP]"] {
            let skipped = skip(&none, "abc", None, Some(message)).unwrap();
            assert!(skipped.reason.starts_with("its message says"), "{message}");
        }
        assert_eq!(skip(&none, "abc", None, Some("skip preview please")), None);
    }

    #[test]
    fn only_the_first_64_globs_of_a_list_are_used() {
        let docs = files(&["docs/a.md"]);
        let unused = |count: usize| -> Vec<String> {
            (0..count).map(|n| format!("unused-{n}/**")).collect()
        };
        let ignoring = |globs: Vec<String>| Triggers {
            ignore_paths: globs,
            ..Default::default()
        };
        // The 64th glob still counts: the docs change is left out.
        let mut sixty_four = unused(63);
        sixty_four.push("docs/**".into());
        assert!(skip(&ignoring(sixty_four), "abc", Some(&docs), None).is_some());
        // The 65th is ignored: the docs change counts, and the commit deploys.
        let mut sixty_five = unused(64);
        sixty_five.push("docs/**".into());
        assert_eq!(
            skip(&ignoring(sixty_five.clone()), "abc", Some(&docs), None),
            None
        );
        // The same for `paths`: a file only the 65th names is not wanted.
        let wanting = Triggers {
            paths: sixty_five,
            ..Default::default()
        };
        let skipped = skip(&wanting, "abc", Some(&docs), None);
        assert_eq!(skipped.unwrap().reason, "only `docs/` changed");
    }

    #[test]
    fn a_name_shown_in_the_reason_is_cut_at_100_characters() {
        let all = triggers(&[], &["**"]);
        let long_file = "a".repeat(300);
        let reason = skip(&all, "abc", Some(&files(&[long_file.as_str()])), None)
            .unwrap()
            .reason;
        assert_eq!(reason, format!("only `{}` changed", "a".repeat(100)));
        let in_long_folder = format!("{}/x.md", "d".repeat(300));
        let reason = skip(&all, "abc", Some(&files(&[in_long_folder.as_str()])), None)
            .unwrap()
            .reason;
        assert_eq!(reason, format!("only `{}/` changed", "d".repeat(100)));
    }

    #[test]
    fn names_from_the_repository_cannot_break_out_of_their_code_span() {
        let docs = triggers(&[], &["**"]);
        let hostile = files(&["a`\n[click](https://evil.example)`.md"]);
        let reason = skip(&docs, "abc", Some(&hostile), None).unwrap().reason;
        assert_eq!(reason.matches('`').count(), 2, "{reason}");
        assert!(!reason.contains('\n'), "{reason}");
    }
}
