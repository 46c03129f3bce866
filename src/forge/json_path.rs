//! One string read out of a JSON document without building the document. Before a delivery is
//! verified previewd needs only its repository, to find whose webhook secret applies
//! ([`super::seam::WebhookDescriptor::repository_of`]); a delivery is tens of kilobytes, and a
//! `serde_json::Value` of it is an allocation for every key and value in it. Here the whole
//! document is still checked for syntax (a body that is not JSON is refused as before), but
//! only the keys on the path are compared, in place, and only the string found is kept.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The string at `path` (object keys from the top) in `json`: `None` when a key is missing or
/// the value there is not a string. Fails only when `json` is not one JSON value. A key given
/// twice counts at its last place, as it does in a `serde_json::Value`.
pub fn string_at(json: &[u8], path: &[&str]) -> Result<Option<String>, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let found = StringAt(path).deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(found)
}

/// Looks for the rest of the path in the value it is given.
struct StringAt<'p>(&'p [&'p str]);

impl<'de> DeserializeSeed<'de> for StringAt<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StringAt<'_> {
    type Value = Option<String>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_str<E>(self, value: &str) -> Result<Self::Value, E> {
        Ok(self.0.is_empty().then(|| value.to_string()))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Self::Value, A::Error> {
        while items.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        let Some((key, rest)) = self.0.split_first() else {
            // The path ends at an object, not a string.
            while entries.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(found);
        };
        while let Some(on_path) = entries.next_key_seed(KeyIs(key))? {
            if on_path {
                found = entries.next_value_seed(StringAt(rest))?;
            } else {
                entries.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// Whether an object's key is the one named, compared where it lies (an escaped key in the
/// parser's scratch space), never copied.
struct KeyIs<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::string_at;

    const PATH: &[&str] = &["repository", "full_name"];

    /// What a `serde_json::Value` of the document says at `path`, the reading this replaces.
    fn by_value(json: &[u8], path: &[&str]) -> Option<Option<String>> {
        let value: serde_json::Value = serde_json::from_slice(json).ok()?;
        let mut node = &value;
        for key in path {
            node = &node[*key];
        }
        Some(node.as_str().map(str::to_string))
    }

    #[test]
    fn reads_the_string_at_the_path_and_nothing_else() {
        let found = |json: &str| string_at(json.as_bytes(), PATH).unwrap();
        assert_eq!(
            found(r#"{"a": [1, {"b": null}], "repository": {"id": 1, "full_name": "o/r"}}"#),
            Some("o/r".into())
        );
        assert_eq!(found(r#"{"repository": {"name": "r"}}"#), None);
        assert_eq!(found(r#"{"repository": {"full_name": 7}}"#), None);
        assert_eq!(
            found(r#"{"repository": {"full_name": {"x": "o/r"}}}"#),
            None
        );
        assert_eq!(found(r#"{"repository": ["o/r"]}"#), None);
        assert_eq!(found(r#"{"full_name": "o/r"}"#), None);
        assert_eq!(found(r#""o/r""#), None);
        assert_eq!(found("[]"), None);
        // An escaped key is the same key; the string is unescaped.
        assert_eq!(
            found(r#"{"repo\u0073itory": {"full_name": "o\/r"}}"#),
            Some("o/r".into())
        );
    }

    #[test]
    fn a_key_given_twice_counts_at_its_last_place_as_in_a_value() {
        for json in [
            r#"{"repository": {"full_name": "a/a"}, "repository": {"full_name": "b/b"}}"#,
            r#"{"repository": {"full_name": "a/a", "full_name": "b/b"}}"#,
            r#"{"repository": {"full_name": "a/a"}, "repository": {}}"#,
        ] {
            assert_eq!(
                string_at(json.as_bytes(), PATH).ok(),
                by_value(json.as_bytes(), PATH),
                "{json}"
            );
        }
    }

    #[test]
    fn what_is_not_one_json_value_is_refused_whole() {
        for json in [
            "",
            "{not json",
            r#"{"repository": {"full_name": "o/r"}} trailing"#,
            r#"{"repository": {"full_name": "o/r"}, "rest": [1, 2}"#,
            r#"{"other": "unterminated}"#,
        ] {
            assert!(string_at(json.as_bytes(), PATH).is_err(), "{json:?}");
        }
    }

    #[test]
    fn deep_nesting_is_skipped_without_recursion() {
        // What is off the path is skipped by serde_json without recursing: a hundred thousand
        // levels neither overflow the stack nor hide the repository.
        let (open, close) = ("[".repeat(100_000), "]".repeat(100_000));
        let deep = format!(r#"{{"a": {open}{close}, "repository": {{"full_name": "o/r"}}}}"#);
        assert_eq!(
            string_at(deep.as_bytes(), PATH).unwrap(),
            Some("o/r".into())
        );
        let at_the_path = format!(r#"{{"repository": {{"full_name": {open}{close}}}}}"#);
        assert_eq!(string_at(at_the_path.as_bytes(), PATH).unwrap(), None);
        let unclosed = format!(r#"{{"repository": {open}}}"#);
        assert!(string_at(unclosed.as_bytes(), PATH).is_err());
    }

    #[test]
    fn agrees_with_a_value_on_every_recorded_delivery() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures");
        let paths: [&[&str]; 2] = [PATH, &["project", "path_with_namespace"]];
        let mut read = 0;
        for forge in ["github", "gitlab"] {
            for entry in std::fs::read_dir(fixtures.join(forge)).unwrap() {
                let json = std::fs::read(entry.unwrap().path()).unwrap();
                for path in paths {
                    assert_eq!(string_at(&json, path).ok(), by_value(&json, path));
                }
                read += 1;
            }
        }
        assert!(read >= 10, "only {read} fixtures read");
    }
}
