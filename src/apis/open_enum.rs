//! String enums Koordinator's own components write, read as open sets: a value this version does
//! not know (a newer koord-scheduler's phase, say) is kept as written in `Other` and written back
//! unchanged, instead of failing the whole object's decode.

/// An enum of known string values plus `Other(String)`; (de)serialized and described in the CRD
/// schema as a plain string.
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this version does not know, as written.
            Other(String),
        }

        impl $name {
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $text,)+
                    Self::Other(text) => text,
                }
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> Self {
                match text.as_str() {
                    $($text => Self::$variant,)+
                    _ => Self::Other(text),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                <String as serde::Deserialize>::deserialize(deserializer).map(Self::from)
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string" })
            }
        }
    };
}

pub(crate) use open_enum;

#[cfg(test)]
mod tests {
    open_enum! {
        pub enum Phase { Ready = "Ready", Gone = "Gone" }
    }

    #[test]
    fn unknown_values_are_kept_and_written_back() {
        let known: Phase = serde_json::from_str("\"Ready\"").unwrap();
        assert_eq!(known, Phase::Ready);
        let other: Phase = serde_json::from_str("\"Migrating\"").unwrap();
        assert_eq!(other, Phase::Other("Migrating".into()));
        assert_eq!(serde_json::to_string(&other).unwrap(), "\"Migrating\"");
        assert_eq!(serde_json::to_string(&Phase::Gone).unwrap(), "\"Gone\"");
        assert!(
            serde_json::from_str::<Phase>("3").is_err(),
            "a number is no phase"
        );
    }
}
