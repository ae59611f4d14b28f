//! The JSON patch a mutating chain answers with.
//!
//! The generic diff serialises both objects whole. [`Builder`] diffs them piece by piece instead:
//! pieces that compare equal as typed values are never serialised, which is most of a pod
//! (see [`pod`]).

pub mod pod;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use serde::Serialize;
use serde_json::Value;

/// How an endpoint turns the object before and after its chain into a patch.
pub type Differ<T> = fn(T, T) -> Result<Option<Vec<u8>>, serde_json::Error>;

/// RFC 6902 diff between the object before and after the chain; `None` when nothing changed.
pub fn diff<T: Serialize + PartialEq>(
    before: T,
    after: T,
) -> Result<Option<Vec<u8>>, serde_json::Error> {
    let mut builder = Builder::default();
    builder.field("", &before, &after)?;
    builder.finish()
}

/// Collects the operations of a patch from diffs of separate parts of one document.
#[derive(Default)]
pub struct Builder {
    ops: Vec<PatchOperation>,
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
        let pointer = || PointerBuf::parse(path).expect("paths are built from literal tokens");
        let before = serde_json::to_value(before)?;
        let after = serde_json::to_value(after)?;
        match (&before, after) {
            (_, Value::Null) if !path.is_empty() => self
                .ops
                .push(PatchOperation::Remove(RemoveOperation { path: pointer() })),
            (Value::Null, value) if !path.is_empty() => {
                self.ops.push(PatchOperation::Add(AddOperation {
                    path: pointer(),
                    value,
                }))
            }
            (_, after) => {
                let root = pointer();
                self.ops.extend(
                    json_patch::diff(&before, &after)
                        .0
                        .into_iter()
                        .map(|op| under(&root, op)),
                );
            }
        }
        Ok(())
    }

    /// The patch as JSON, or `None` when no part changed.
    pub fn finish(self) -> Result<Option<Vec<u8>>, serde_json::Error> {
        if self.ops.is_empty() {
            return Ok(None);
        }
        serde_json::to_vec(&Patch(self.ops)).map(Some)
    }
}

/// `op` with its path moved below `root`. A diff yields only add, remove and replace.
fn under(root: &PointerBuf, mut op: PatchOperation) -> PatchOperation {
    if root.is_root() {
        return op;
    }
    let path = match &mut op {
        PatchOperation::Add(o) => &mut o.path,
        PatchOperation::Remove(o) => &mut o.path,
        PatchOperation::Replace(o) => &mut o.path,
        PatchOperation::Move(o) => &mut o.path,
        PatchOperation::Copy(o) => &mut o.path,
        PatchOperation::Test(o) => &mut o.path,
    };
    *path = root.concat(path);
    op
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Applies `patch` to `before` and returns the result.
    pub(super) fn apply(before: &Value, patch: &[u8]) -> Value {
        let patch: Patch = serde_json::from_slice(patch).unwrap();
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
        let bytes = builder.finish().unwrap().unwrap();
        assert_eq!(apply(&before, &bytes), after);
        // And a part that disappears is removed, not set to null.
        let mut builder = Builder::default();
        builder.field("/f", &after["f"], &Value::Null).unwrap();
        let bytes = builder.finish().unwrap().unwrap();
        assert_eq!(apply(&after, &bytes), json!({"a": after["a"], "d": [1, 2]}));
    }
}
