//! Deterministic DNS-1123 names for environments and their namespaces, whatever the branch is
//! called: lower-case, only `[a-z0-9-]`, truncated, and ending in a hash of every input that
//! decides the name.
//!
//! The hash is what keeps names apart, and names are what keep environments apart: two
//! environments with one name would share one record, and two with one namespace name one
//! namespace. Branch names are chosen by whoever pushes, so the hash is long enough (64 bits)
//! that a deliberate collision is out of reach, and it covers every input (template, whether it
//! is a branch or a pull request, the namespace prefix), each length-prefixed so that no two
//! different inputs hash the same text: a branch named `pr-5` and PR #5 never share an
//! environment, and no template can pick a prefix that yields another's namespace.

use kube::ResourceExt;
use sha2::{Digest, Sha256};

use super::crd::{PreviewEnvironment, PreviewTemplateSpec};

/// The longest DNS-1123 label.
pub const MAX_LABEL: usize = 63;
/// Hex digits of the hash at the end of every name (64 bits).
const HASH_LEN: usize = 16;

/// `text` reduced to `[a-z0-9-]` (runs of anything else become one `-`), trimmed of `-`.
pub fn slug(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

/// `branch` as one DNS label that no other branch gets: its [`slug`] when that is the branch
/// itself and fits a label, else the slug (truncated) with `--` and a hash of the branch
/// (`feature/login` → `feature-login--<16 hex>`, never `feature-login`, which the branch
/// `feature-login` keeps). A slug never contains `--`, so no branch can pick a name that ends
/// up as another's hashed form; the hash is as long as the names' (64 bits), since branch
/// names are chosen by whoever pushes. The `slug` of a render, and so usually of a URL host.
pub fn unique_slug(branch: &str) -> String {
    let plain = slug(branch);
    if plain == branch && plain.len() <= MAX_LABEL && !plain.is_empty() {
        return plain;
    }
    let mut readable = plain;
    readable.truncate(MAX_LABEL - HASH_LEN - 2);
    let readable = match readable.trim_end_matches('-') {
        // Every hashed form keeps its `--`, so no plain branch name can equal one.
        "" => "branch",
        readable => readable,
    };
    format!("{readable}--{}", identity_hash(&[branch]))
}

/// The first `HASH_LEN` hex digits of SHA-256 over `identity`, each part length-prefixed.
fn identity_hash(identity: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in identity {
        hasher.update(part.len().to_le_bytes());
        hasher.update(part.as_bytes());
    }
    let mut hash = hex::encode(hasher.finalize());
    hash.truncate(HASH_LEN);
    hash
}

/// A DNS-1123 label `<slug of readable>-<hash of identity>` of at most `max` characters. The
/// readable part is for people (truncated as needed); the hash alone tells names apart.
fn label(readable: &[&str], identity: &[&str], max: usize) -> String {
    let hash = identity_hash(identity);
    let room = max.min(MAX_LABEL) - HASH_LEN - 1;
    let mut name = slug(&readable.join("-"));
    name.truncate(room);
    let name = name.trim_end_matches('-');
    if name.is_empty() {
        format!("x-{hash}")
    } else {
        format!("{name}-{hash}")
    }
}

/// Name of the `PreviewEnvironment` for a branch or pull request of a template.
pub fn environment_name(template: &str, branch: &str, pull_request: Option<u64>) -> String {
    match pull_request {
        Some(number) => {
            let number = number.to_string();
            label(
                &[template, "pr", &number],
                &["environment", template, "pull-request", &number],
                MAX_LABEL,
            )
        }
        None => label(
            &[template, branch],
            &["environment", template, "branch", branch],
            MAX_LABEL,
        ),
    }
}

/// Namespace of an environment: `<prefix>-<environment namespace>-<environment name>-<hash>`,
/// the hash over all three.
pub fn namespace_name(prefix: &str, environment_namespace: &str, environment: &str) -> String {
    label(
        &[prefix, environment_namespace, environment],
        &["namespace", prefix, environment_namespace, environment],
        MAX_LABEL,
    )
}

/// The namespace of `environment` deployed from `template`: deterministic, so that a restarted
/// previewd (or the finalizer, after the template is gone) finds the same one.
pub fn environment_namespace(
    environment: &PreviewEnvironment,
    template: &PreviewTemplateSpec,
) -> String {
    let prefix = template.namespace.prefix.as_deref().unwrap_or("preview");
    namespace_name(
        prefix,
        &environment.namespace().unwrap_or_default(),
        &environment.name_any(),
    )
}

/// Name of the record, in a target cluster's namespace, of the hub's object `name` (an
/// environment or a template) in `hub_namespace`: the hash tells apart the same name from two
/// hub namespaces placed into one target namespace.
pub fn record_name(kind: &str, hub_namespace: &str, name: &str) -> String {
    label(
        &[hub_namespace, name],
        &["record", kind, hub_namespace, name],
        MAX_LABEL,
    )
}

/// Whether `name` is a valid DNS-1123 label.
pub fn is_dns1123_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_LABEL
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn awkward_branch_names_become_valid_labels() {
        for branch in [
            "feature/ÄÖ_very-long-branch-name-that-goes-on-and-on-and-on-well-past-sixty-three",
            "../../etc",
            "___",
            "",
            "UPPER/Case",
            "ü",
        ] {
            let name = environment_name("web", branch, None);
            assert!(is_dns1123_label(&name), "{branch:?} gave {name:?}");
            let ns = namespace_name("preview", "team-a", &name);
            assert!(is_dns1123_label(&ns), "{branch:?} gave namespace {ns:?}");
        }
    }

    #[test]
    fn similar_branches_never_collide() {
        let a = environment_name("web", "feature/a_b", None);
        let b = environment_name("web", "feature/a-b", None);
        let c = environment_name("web", "Feature/A-B", None);
        assert_ne!(a, b);
        assert_ne!(b, c);
        let long = "x".repeat(100);
        assert_ne!(
            environment_name("web", &format!("{long}1"), None),
            environment_name("web", &format!("{long}2"), None)
        );
    }

    #[test]
    fn a_branch_named_like_a_pull_request_is_another_environment() {
        assert_ne!(
            environment_name("web", "pr-5", None),
            environment_name("web", "x", Some(5))
        );
        // Template and branch split differently give other names too.
        assert_ne!(
            environment_name("web-pr", "5", None),
            environment_name("web", "pr-5", None)
        );
    }

    #[test]
    fn the_prefix_is_part_of_the_namespace_hash() {
        // Same readable text, split differently between prefix and namespace: other names.
        let a = namespace_name("preview-team", "a", "web-pr-1");
        let b = namespace_name("preview", "team-a", "web-pr-1");
        assert_ne!(a, b);
        assert_eq!(a.len() - a.rfind('-').unwrap() - 1, HASH_LEN);
    }

    #[test]
    fn names_are_deterministic_and_readable() {
        assert_eq!(
            environment_name("web", "feature/login", None),
            environment_name("web", "feature/login", None)
        );
        assert!(environment_name("web", "feature/login", None).starts_with("web-feature-login-"));
        assert!(environment_name("web", "x", Some(42)).starts_with("web-pr-42-"));
        assert_eq!(slug("Feature/ÄÖ_x"), "feature-x");
    }

    #[test]
    fn unique_slugs_keep_branches_apart_that_plain_slugs_merge() {
        assert_eq!(unique_slug("feature-login"), "feature-login");
        let merged = [
            "feature/login",
            "Feature-Login",
            "feature_login",
            "feature-login-",
        ];
        let mut seen = vec![unique_slug("feature-login")];
        for branch in merged {
            let unique = unique_slug(branch);
            assert!(unique.starts_with("feature-login--"), "{unique}");
            assert!(!seen.contains(&unique), "{branch} → {unique}");
            seen.push(unique);
        }
        // A branch named like another's hashed form is hashed itself.
        let hashed = unique_slug("feature/login");
        assert_ne!(unique_slug(&hashed), hashed);
        // Always one DNS label, whatever the branch, and a hashed one always has its `--`.
        assert!(unique_slug("ÄÖÜ").starts_with("branch--"));
        for branch in [
            "a".repeat(300),
            "ÄÖÜ".into(),
            "--".into(),
            "/".into(),
            "x".repeat(63),
        ] {
            let unique = unique_slug(&branch);
            assert!(is_dns1123_label(&unique), "{branch:?} → {unique:?}");
        }
    }
}
