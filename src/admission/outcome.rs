//! What a plugin returns when it refuses a request.

/// A refusal with the HTTP-like code the API server shows to the user (docs/admission.md, conventions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: u16,
    pub message: String,
}

impl Rejection {
    /// A rule was broken: code 400, as Koordinator answers nearly every rejection.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: 400,
            message: message.into(),
        }
    }

    /// A lookup or a parse inside a plugin failed: code 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            code: 500,
            message: message.into(),
        }
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self {
            code: 403,
            message: message.into(),
        }
    }
}

pub type PluginResult = Result<(), Rejection>;
