//! Schema overrides for fields Koordinator declares schemaless.

use schemars::{Schema, SchemaGenerator, json_schema};

/// An object the API server stores as given (`x-kubernetes-preserve-unknown-fields`).
pub fn preserve_unknown_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Same, but the field may be absent (`nullable`).
pub fn optional_preserve_unknown_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true
    })
}
