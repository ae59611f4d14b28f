//! The method lists of serde's `Deserializer` and `Visitor`, for the wrappers that pass every call
//! on to the deserializer or visitor they wrap (`apis/unread_fields.rs`, `memory/metered.rs`): each
//! wrapper says once what one forwarded call does, and these say which calls there are.

/// Calls `$each!` with every `Deserializer::deserialize_*` method and its arguments besides the
/// visitor.
macro_rules! each_deserialize_method {
    ($each:ident) => {
        $each!(
            deserialize_any(),
            deserialize_bool(),
            deserialize_i8(),
            deserialize_i16(),
            deserialize_i32(),
            deserialize_i64(),
            deserialize_i128(),
            deserialize_u8(),
            deserialize_u16(),
            deserialize_u32(),
            deserialize_u64(),
            deserialize_u128(),
            deserialize_f32(),
            deserialize_f64(),
            deserialize_char(),
            deserialize_str(),
            deserialize_string(),
            deserialize_bytes(),
            deserialize_byte_buf(),
            deserialize_option(),
            deserialize_unit(),
            deserialize_unit_struct(name: &'static str),
            deserialize_newtype_struct(name: &'static str),
            deserialize_seq(),
            deserialize_tuple(len: usize),
            deserialize_tuple_struct(name: &'static str, len: usize),
            deserialize_map(),
            deserialize_struct(name: &'static str, fields: &'static [&'static str]),
            deserialize_enum(name: &'static str, variants: &'static [&'static str]),
            deserialize_identifier(),
            deserialize_ignored_any(),
        );
    };
}

/// Calls `$each!` with every `Visitor::visit_*` method that takes a plain value, and its type.
macro_rules! each_visit_value_method {
    ($each:ident) => {
        $each!(
            visit_bool(bool),
            visit_i8(i8),
            visit_i16(i16),
            visit_i32(i32),
            visit_i64(i64),
            visit_i128(i128),
            visit_u8(u8),
            visit_u16(u16),
            visit_u32(u32),
            visit_u64(u64),
            visit_u128(u128),
            visit_f32(f32),
            visit_f64(f64),
            visit_char(char),
            visit_str(&str),
            visit_borrowed_str(&'de str),
            visit_string(String),
            visit_bytes(&[u8]),
            visit_borrowed_bytes(&'de [u8]),
            visit_byte_buf(Vec<u8>),
        );
    };
}

pub(crate) use {each_deserialize_method, each_visit_value_method};
