//! The JSON patch a mutating chain answers with.
//!
//! The generic diff serialises both objects whole. [`Builder`] diffs them piece by piece instead:
//! pieces that compare equal as typed values are never serialised, which is most of a pod
//! (see [`pod`]).

mod builder;
pub mod pod;

pub use builder::Builder;

use serde::Serialize;

/// How an endpoint turns the object before and after its chain into a patch.
pub type Differ<T> = fn(T, T) -> Result<Option<Vec<u8>>, serde_json::Error>;

/// RFC 6902 diff between the object before and after the chain; `None` when nothing changed.
pub fn diff<T: Serialize + PartialEq>(
    before: T,
    after: T,
) -> Result<Option<Vec<u8>>, serde_json::Error> {
    let mut builder = Builder::default();
    builder.field("", &before, &after)?;
    Ok(builder.finish())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::Value;
    use serde_json::json;
    use std::collections::BTreeMap;

    /// Applies `patch` to `before` and returns the result.
    pub(crate) fn apply(before: &Value, patch: &[u8]) -> Value {
        let patch: json_patch::Patch = serde_json::from_slice(patch).unwrap();
        let mut doc = before.clone();
        json_patch::patch(&mut doc, &patch).unwrap();
        doc
    }

    #[test]
    fn identical_objects_give_no_patch() {
        let v = json!({"metadata": {"labels": {"a": "b"}}});
        assert_eq!(diff(&v, &v.clone()).unwrap(), None);
    }

    #[test]
    fn patch_applied_to_before_gives_after() {
        let before =
            json!({"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}});
        let after = json!({"metadata": {"labels": {"a": "b", "x/y~z": "1"}},
                           "spec": {"containers": [{"name": "c", "resources": {}}], "schedulerName": "koord"}});
        let bytes = diff(&before, &after).unwrap().unwrap();
        assert_eq!(apply(&before, &bytes), after);
        // JSON pointer escaping of '/' and '~' in label keys.
        assert!(String::from_utf8(bytes).unwrap().contains("x~1y~0z"));
    }

    #[test]
    fn parts_are_diffed_below_their_paths() {
        let before = json!({"a": {"b": {"c": 1}}, "d": [1, 2]});
        let after = json!({"a": {"b": {"c": 2, "e": 3}}, "d": [1, 2], "f": "new"});
        let mut builder = Builder::default();
        builder
            .field("/a/b", &before["a"]["b"], &after["a"]["b"])
            .unwrap();
        builder.field("/d", &before["d"], &after["d"]).unwrap();
        builder.field("/f", &Value::Null, &after["f"]).unwrap();
        let bytes = builder.finish().unwrap();
        assert_eq!(apply(&before, &bytes), after);
        // And a part that disappears is removed, not set to null.
        let mut builder = Builder::default();
        builder.field("/f", &after["f"], &Value::Null).unwrap();
        let bytes = builder.finish().unwrap();
        assert_eq!(apply(&after, &bytes), json!({"a": after["a"], "d": [1, 2]}));
    }

    #[test]
    fn string_maps_are_diffed_key_by_key() {
        let before = json!({"m": {"a": "1", "b/c": "2", "d~e": "3"}});
        let after = json!({"m": {"a": "1", "b/c": "20", "x": "4"}});
        let map = |v: &Value| -> BTreeMap<String, String> {
            serde_json::from_value(v["m"].clone()).unwrap()
        };
        let mut builder = Builder::default();
        builder
            .string_map("/m", Some(&map(&before)), Some(&map(&after)))
            .unwrap();
        let bytes = builder.finish().unwrap();
        assert_eq!(apply(&before, &bytes), after);
        let text = String::from_utf8(bytes).unwrap();
        assert!(
            text.contains(r#""path":"/m/b~1c""#) && text.contains(r#""path":"/m/d~0e""#),
            "{text}"
        );
        // A map none of whose entries is kept is replaced whole.
        let mut builder = Builder::default();
        let replaced = json!({"m": {"b/c": "3", "y": "5"}});
        builder
            .string_map("/m", Some(&map(&before)), Some(&map(&replaced)))
            .unwrap();
        let bytes = builder.finish().unwrap();
        assert_eq!(apply(&before, &bytes), replaced);
        assert_eq!(
            serde_json::from_slice::<Vec<Value>>(&bytes).unwrap().len(),
            1
        );
        // A map that appears or goes is added or removed whole.
        let mut builder = Builder::default();
        builder.string_map("/m", None, Some(&map(&after))).unwrap();
        assert_eq!(apply(&json!({}), &builder.finish().unwrap()), after);
        let mut builder = Builder::default();
        builder
            .string_map::<String>("/m", Some(&map(&after)), None)
            .unwrap();
        assert_eq!(apply(&after, &builder.finish().unwrap()), json!({}));
    }
}
