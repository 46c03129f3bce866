//! One string read out of a JSON document without building the document. Before a delivery is
//! verified previewd needs only its repository, to find whose webhook secret applies
//! ([`super::seam::WebhookDescriptor::repository_of`]); a delivery is tens of kilobytes, and a
//! `serde_json::Value` of it is an allocation for every key and value in it. Here the whole
//! document is still read as a `Value` would read it, and refused where a `Value` would be (not
//! JSON, cut short or followed by more, a string that is not UTF-8 or a lone surrogate, a number
//! out of range, nesting past serde_json's 128 levels: a malformed delivery stays a 400), but
//! nothing is built: keys are compared where they lie, and only the string found is kept.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The string at `path` (object keys from the top) in `json`: `None` when a key is missing or
/// the value there is not a string. Fails where reading `json` as a `serde_json::Value` would.
/// A key given twice counts at its last place, as it does in a `Value`.
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

    fn visit_seq<A: SeqAccess<'de>>(self, items: A) -> Result<Self::Value, A::Error> {
        Skip.visit_seq(items).map(|()| None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Self::Value, A::Error> {
        let Some((key, rest)) = self.0.split_first() else {
            // The path ends at an object, not a string.
            return Skip.visit_map(entries).map(|()| None);
        };
        let mut found = None;
        while let Some(on_path) = entries.next_key_seed(KeyIs(key))? {
            if on_path {
                found = entries.next_value_seed(StringAt(rest))?;
            } else {
                entries.next_value_seed(Skip)?;
            }
        }
        Ok(found)
    }
}

/// Reads a value off the path as a `Value` would (every string decoded, every number parsed,
/// every level counted against serde_json's limit) and keeps nothing. serde's `IgnoredAny`
/// skips faster, but checks only brackets and quotes, and no depth.
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        while items.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<(), A::Error> {
        while entries.next_key_seed(Skip)?.is_some() {
            entries.next_value_seed(Skip)?;
        }
        Ok(())
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
    fn what_a_value_refuses_off_the_path_is_refused_too() {
        let nested = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        let (deep_enough, too_deep, far_too_deep) = (nested(125), nested(129), nested(100_000));
        let refused: [&[u8]; 5] = [
            b"\"\xff\"",
            b"\"\\ud800\"",
            b"1e400",
            too_deep.as_bytes(),
            far_too_deep.as_bytes(),
        ];
        let within = |value: &[u8]| {
            [
                [
                    &br#"{"other": "#[..],
                    value,
                    br#", "repository": {"full_name": "o/r"}}"#,
                ]
                .concat(),
                [
                    &br#"{"repository": {"id": "#[..],
                    value,
                    br#", "full_name": "o/r"}}"#,
                ]
                .concat(),
            ]
        };
        for value in refused {
            for json in within(value) {
                let shown = String::from_utf8_lossy(&json[..json.len().min(60)]).into_owned();
                assert!(by_value(&json, PATH).is_none(), "a Value refuses {shown}");
                assert!(string_at(&json, PATH).is_err(), "{shown}");
            }
        }
        for json in within(deep_enough.as_bytes()) {
            assert!(by_value(&json, PATH).is_some(), "a Value reads 127 levels");
            assert_eq!(string_at(&json, PATH).unwrap(), Some("o/r".into()));
        }
        // On the path too: invalid UTF-8 in the repository's name.
        assert!(string_at(b"{\"repository\": {\"full_name\": \"\xff\"}}", PATH).is_err());
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
