//! Issuing certificates with rcgen. No HTTP and no Kubernetes calls here: the parameters and the
//! pair (`issue.rs`), the CA and the serving pair it signs (`authority.rs`), koord-manager's CA
//! taken over (`adopt.rs`).

pub mod adopt;
pub mod authority;
mod issue;

pub use issue::{CertError, PemPair, self_signed};
