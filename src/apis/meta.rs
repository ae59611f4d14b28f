//! Reading an object's labels and annotations by key.

use kube::Resource;

/// The value of label `key`, if the object has it.
pub fn label<'a, K: Resource>(object: &'a K, key: &str) -> Option<&'a str> {
    object.meta().labels.as_ref()?.get(key).map(String::as_str)
}

/// The value of annotation `key`, if the object has it.
pub fn annotation<'a, K: Resource>(object: &'a K, key: &str) -> Option<&'a str> {
    object
        .meta()
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}
