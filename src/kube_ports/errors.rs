//! How the ports report a failed API call.

use crate::admission::ports::StoreError;

/// A failed API call as the ports report it: 409 is a conflict (read again), the rest as is.
pub(crate) fn store_error(e: kube::Error) -> StoreError {
    match e {
        kube::Error::Api(s) if s.code == 409 => StoreError::Conflict,
        other => StoreError::Other(other.to_string()),
    }
}
