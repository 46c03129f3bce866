//! Deterministic DNS-1123 names for environments and their namespaces, whatever the branch is
//! called: lower-case, only `[a-z0-9-]`, truncated, and with a short hash of the original
//! input so that two branches that differ only in characters we drop never collide.

use kube::ResourceExt;
use sha2::{Digest, Sha256};

use super::crd::{PreviewEnvironment, PreviewTemplateSpec};

/// The longest DNS-1123 label.
pub const MAX_LABEL: usize = 63;
const HASH_LEN: usize = 6;

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

/// First `HASH_LEN` hex digits of SHA-256 of `text`.
pub fn short_hash(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))[..HASH_LEN].to_string()
}

/// A DNS-1123 label `<prefix>-<slug of parts>-<hash>` of at most `max` characters. The hash
/// covers every part exactly as given, so distinct inputs give distinct names.
pub fn label(prefix: &str, parts: &[&str], max: usize) -> String {
    let hash = short_hash(&parts.join("\u{0}"));
    let body = slug(&parts.join("-"));
    let prefix = slug(prefix);
    let room = max.min(MAX_LABEL) - HASH_LEN - 1;
    let mut name = if prefix.is_empty() {
        body
    } else if body.is_empty() {
        prefix
    } else {
        format!("{prefix}-{body}")
    };
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
        Some(number) => label(template, &[&format!("pr-{number}")], MAX_LABEL),
        None => label(template, &[branch], MAX_LABEL),
    }
}

/// Namespace of an environment: `<prefix>-<environment namespace>-<environment name>-<hash>`.
pub fn namespace_name(prefix: &str, environment_namespace: &str, environment: &str) -> String {
    label(prefix, &[environment_namespace, environment], MAX_LABEL)
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
    fn names_are_deterministic_and_readable() {
        assert_eq!(
            environment_name("web", "feature/login", None),
            environment_name("web", "feature/login", None)
        );
        assert!(environment_name("web", "feature/login", None).starts_with("web-feature-login-"));
        assert!(environment_name("web", "x", Some(42)).starts_with("web-pr-42-"));
        assert_eq!(slug("Feature/ÄÖ_x"), "feature-x");
    }
}
