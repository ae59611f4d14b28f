//! The JSON patch a mutating chain answers with.
//!
//! The generic diff serialises both objects whole. [`Builder`] diffs them piece by piece instead:
//! pieces that compare equal as typed values are never serialised, which is most of a pod
//! (see [`pod`]).

pub mod pod;

use std::collections::BTreeMap;

use json_patch::PatchOperation;
use json_patch::jsonptr::Token;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;

use crate::memory::metered::to_value_within;
use serde_json::Value;

use super::json_write;

/// How an endpoint turns the object before and after its chain into a patch.
pub type Differ<T> = fn(T, T) -> Result<Option<Vec<u8>>, serde_json::Error>;

/// A value that is a string in JSON: label values, quantities.
pub trait Text: Serialize + PartialEq {
    fn text(&self) -> &str;
}

impl Text for String {
    fn text(&self) -> &str {
        self
    }
}

impl Text for Quantity {
    fn text(&self) -> &str {
        &self.0
    }
}

/// RFC 6902 diff between the object before and after the chain; `None` when nothing changed.
pub fn diff<T: Serialize + PartialEq>(
    before: T,
    after: T,
) -> Result<Option<Vec<u8>>, serde_json::Error> {
    let mut builder = Builder::default();
    builder.field("", &before, &after)?;
    Ok(builder.finish())
}

/// Writes the operations of a patch, as JSON, from diffs of separate parts of one document.
#[derive(Default)]
pub struct Builder {
    out: Vec<u8>,
    /// Reused for the paths of map keys (a mutation writes tens of them).
    key_path: String,
}

impl Builder {
    /// Diffs the value at `path` (a JSON pointer, `""` for the whole document). A value serialising
    /// to `null` is taken as absent: every object type here skips its `None` fields, so the field is
    /// added or removed whole rather than replaced.
    pub fn field<T: Serialize + PartialEq>(
        &mut self,
        path: &str,
        before: &T,
        after: &T,
    ) -> Result<(), serde_json::Error> {
        if before == after {
            return Ok(());
        }
        // Within what their text allows: the fields a slim object kept as text become trees here.
        let tree = |v: &T| to_value_within(v).map_err(serde::ser::Error::custom);
        let (before, after) = (tree(before)?, tree(after)?);
        match (&before, &after) {
            (_, Value::Null) if !path.is_empty() => self.op("remove", path, None::<&()>),
            (Value::Null, value) if !path.is_empty() => self.op("add", path, Some(value)),
            _ => {
                for op in json_patch::diff(&before, &after).0 {
                    let (name, below, value) = match &op {
                        PatchOperation::Add(o) => ("add", &o.path, Some(&o.value)),
                        PatchOperation::Remove(o) => ("remove", &o.path, None),
                        PatchOperation::Replace(o) => ("replace", &o.path, Some(&o.value)),
                        // A diff yields only the three above.
                        _ => unreachable!("json_patch::diff made {op}"),
                    };
                    self.op(name, &format!("{path}{below}"), value)?;
                }
                Ok(())
            }
        }
    }

    /// Diffs a map of strings to string-like values (labels, resource lists) key by key, without
    /// going through JSON values: the common case of a mutation.
    pub fn string_map<V: Text>(
        &mut self,
        path: &str,
        before: Option<&BTreeMap<String, V>>,
        after: Option<&BTreeMap<String, V>>,
    ) -> Result<(), serde_json::Error> {
        let (Some(before), Some(after)) = (before, after) else {
            return self.field(path, &before, &after);
        };
        if before == after {
            return Ok(());
        }
        // Nothing kept (cpu and memory becoming batch resources): one operation instead of one
        // per key, a smaller patch for us to encode and for the API server to apply.
        if !before
            .iter()
            .any(|(key, value)| after.get(key) == Some(value))
        {
            self.op_start("replace", path);
            self.out.extend_from_slice(br#","value":{"#);
            for (i, (key, value)) in after.iter().enumerate() {
                if i > 0 {
                    self.out.push(b',');
                }
                json_write::string(&mut self.out, key);
                self.out.push(b':');
                json_write::string(&mut self.out, value.text());
            }
            self.out.extend_from_slice(b"}}");
            return Ok(());
        }
        for (key, value) in before {
            match after.get(key) {
                None => self.key_op("remove", path, key, None),
                Some(new) if new != value => self.key_op("replace", path, key, Some(new.text())),
                Some(_) => {}
            }
        }
        for (key, value) in after {
            if !before.contains_key(key) {
                self.key_op("add", path, key, Some(value.text()));
            }
        }
        Ok(())
    }

    /// An operation on the member `key` of the map at `path`.
    fn key_op(&mut self, op: &str, path: &str, key: &str, value: Option<&str>) {
        let mut key_path = std::mem::take(&mut self.key_path);
        key_path.clear();
        key_path.push_str(path);
        key_path.push('/');
        key_path.push_str(Token::new(key).encoded());
        self.op_start(op, &key_path);
        self.key_path = key_path;
        if let Some(value) = value {
            self.out.extend_from_slice(br#","value":"#);
            json_write::string(&mut self.out, value);
        }
        self.out.push(b'}');
    }

    fn op<V: Serialize + ?Sized>(
        &mut self,
        op: &str,
        path: &str,
        value: Option<&V>,
    ) -> Result<(), serde_json::Error> {
        self.op_start(op, path);
        if let Some(value) = value {
            self.out.extend_from_slice(br#","value":"#);
            serde_json::to_writer(&mut self.out, value)?;
        }
        self.out.push(b'}');
        Ok(())
    }

    /// Writes an operation up to its value: `{"op":..,"path":..`.
    fn op_start(&mut self, op: &str, path: &str) {
        if self.out.is_empty() {
            // Room for a typical mutation's operations without regrowing.
            self.out.reserve(2048);
            self.out.push(b'[');
        } else {
            self.out.push(b',');
        }
        self.out.extend_from_slice(br#"{"op":""#);
        self.out.extend_from_slice(op.as_bytes());
        self.out.extend_from_slice(br#"","path":"#);
        json_write::string(&mut self.out, path);
    }

    /// The patch as JSON, or `None` when no part changed.
    pub fn finish(mut self) -> Option<Vec<u8>> {
        if self.out.is_empty() {
            return None;
        }
        self.out.push(b']');
        Some(self.out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

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
