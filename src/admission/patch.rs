//! The JSON patch a mutating chain answers with.

use serde::Serialize;

/// RFC 6902 diff between the object before and after the chain; `None` when nothing changed.
pub fn diff<T: Serialize>(before: &T, after: &T) -> Result<Option<Vec<u8>>, serde_json::Error> {
    let before = serde_json::to_value(before)?;
    let after = serde_json::to_value(after)?;
    let patch = json_patch::diff(&before, &after);
    if patch.0.is_empty() {
        return Ok(None);
    }
    serde_json::to_vec(&patch).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        let mut doc = before.clone();
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(doc, after);
        // JSON pointer escaping of '/' and '~' in label keys.
        assert!(String::from_utf8(bytes).unwrap().contains("x~1y~0z"));
    }
}
