//! The names previewd gives PostgreSQL objects: a fixed prefix and a hash of what identifies
//! them, so nothing a template or a pull request wrote reaches a name, a restart finds the
//! same objects again, and previewd's objects are told from everyone else's by prefix.

use sha2::{Digest, Sha256};

/// Prefix of every branch database and its role.
pub const BRANCH_PREFIX: &str = "pvd_env_";
/// Prefix of every baseline role and baseline database.
pub const BASELINE_PREFIX: &str = "pvd_base_";

/// What a template's database is known by: the template and the name it gives the database.
#[derive(Debug, Clone, Copy)]
pub struct BaselineKey<'a> {
    pub template_namespace: &'a str,
    pub template_name: &'a str,
    pub database: &'a str,
}

/// `parts`, each length-prefixed so no two lists hash alike, as `chars` hex digits.
fn digest(parts: &[&str], chars: usize) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let mut text = hex::encode(hasher.finalize());
    text.truncate(chars);
    text
}

/// The baseline role of a template's database (one for all its versions).
pub fn baseline_role(key: BaselineKey<'_>) -> String {
    let hash = digest(
        &[key.template_namespace, key.template_name, key.database],
        16,
    );
    format!("{BASELINE_PREFIX}{hash}")
}

/// The baseline database holding `version` of a template's database.
pub fn baseline_database(key: BaselineKey<'_>, version: &str) -> String {
    format!("{}_{}", baseline_role(key), digest(&[version], 8))
}

/// The branch (database and role) of one environment's database.
pub fn branch(environment_uid: &str, database: &str) -> String {
    format!(
        "{BRANCH_PREFIX}{}",
        digest(&[environment_uid, database], 24)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: BaselineKey<'static> = BaselineKey {
        template_namespace: "team-a",
        template_name: "shop",
        database: "orders",
    };

    #[test]
    fn names_are_short_plain_and_the_same_on_every_call() {
        for name in [
            baseline_role(KEY),
            baseline_database(KEY, "sha256:abc"),
            branch("3f2a-uid", "orders"),
        ] {
            assert!(
                name.len() <= crate::database::sql::MAX_IDENTIFIER_BYTES,
                "{name}"
            );
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
        }
        assert_eq!(branch("u", "orders"), branch("u", "orders"));
        assert!(baseline_database(KEY, "v1").starts_with(&baseline_role(KEY)));
    }

    #[test]
    fn different_owners_never_share_a_name() {
        assert_ne!(branch("u1", "orders"), branch("u2", "orders"));
        assert_ne!(branch("u1", "orders"), branch("u1", "users"));
        // Length prefixes: moving a boundary changes the name.
        assert_ne!(branch("ab", "c"), branch("a", "bc"));
        let other = BaselineKey {
            template_namespace: "team-b",
            ..KEY
        };
        assert_ne!(baseline_role(KEY), baseline_role(other));
        assert_ne!(baseline_database(KEY, "v1"), baseline_database(KEY, "v2"));
    }
}
