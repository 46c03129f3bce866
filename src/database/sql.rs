//! Writing names and values into SQL text.
//!
//! PostgreSQL takes no bound parameter in `CREATE DATABASE`, `CREATE ROLE` or `COMMENT ON`, so
//! those statements carry identifiers and values as text. These two functions are the only
//! way such text is made: an identifier is always double-quoted, a value always an escape
//! string, whatever the input holds. Catalogue queries bind their values as parameters.

use super::DatabaseError;

/// PostgreSQL's identifier length in bytes (`NAMEDATALEN - 1`): it silently truncates longer
/// ones, so two long names could meet as one.
pub const MAX_IDENTIFIER_BYTES: usize = 63;

/// `name` as a quoted identifier: `"` doubled inside double quotes. Refuses NUL (PostgreSQL
/// cannot hold it), the empty name and names PostgreSQL would truncate.
pub fn ident(name: &str) -> Result<String, DatabaseError> {
    if name.is_empty() || name.contains('\0') || name.len() > MAX_IDENTIFIER_BYTES {
        return Err(DatabaseError::Unwritable(format!(
            "an identifier of {} bytes{}",
            name.len(),
            if name.contains('\0') { " with NUL" } else { "" }
        )));
    }
    Ok(format!("\"{}\"", name.replace('"', "\"\"")))
}

/// `text` as an escape string constant (`E'…'`): `'` and `\` escaped, so it means the same
/// whatever the server's `standard_conforming_strings`. Refuses NUL.
pub fn literal(text: &str) -> Result<String, DatabaseError> {
    if text.contains('\0') {
        return Err(DatabaseError::Unwritable("a value with NUL".into()));
    }
    Ok(format!(
        "E'{}'",
        text.replace('\\', "\\\\").replace('\'', "\\'")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identifier_is_always_one_quoted_name() {
        assert_eq!(ident("app").unwrap(), "\"app\"");
        assert_eq!(
            ident("x\"; DROP ROLE admin; --").unwrap(),
            "\"x\"\"; DROP ROLE admin; --\""
        );
        assert_eq!(ident("a\\b'c").unwrap(), "\"a\\b'c\"");
    }

    #[test]
    fn names_postgresql_cannot_hold_or_would_cut_are_refused() {
        assert!(ident("").is_err());
        assert!(ident("a\0b").is_err());
        assert!(ident(&"a".repeat(64)).is_err());
        assert!(ident(&"a".repeat(63)).is_ok());
        // 32 two-byte characters are 64 bytes.
        assert!(ident(&"é".repeat(32)).is_err());
    }

    #[test]
    fn a_value_is_always_one_escape_string() {
        assert_eq!(literal("secret").unwrap(), "E'secret'");
        assert_eq!(
            literal("x'; ALTER ROLE me SUPERUSER; --").unwrap(),
            "E'x\\'; ALTER ROLE me SUPERUSER; --'"
        );
        assert_eq!(literal("a\\'b").unwrap(), "E'a\\\\\\'b'");
        assert!(literal("a\0").is_err());
    }
}
