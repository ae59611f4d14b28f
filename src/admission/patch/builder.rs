//! [`Builder`]: a patch's operations written piece by piece, pieces that compare equal as typed
//! values never serialised; and [`Text`], the values that are strings in JSON.

use std::collections::BTreeMap;

use json_patch::PatchOperation;
use json_patch::jsonptr::Token;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;
use serde_json::Value;

use crate::admission::json_write;
use crate::memory::metered::to_value_within;

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
