//! The admission framework's ports: what plugins reach outside the process through. The framework
//! holds them in `env.rs`'s `Services`; the API-server implementations live in `src/kube_ports/`,
//! the in-memory ones (unit tests) in `memory.rs`. Plugins and the
//! framework depend on these traits only, never on each other's types.

mod contracts;
#[cfg(test)]
pub(crate) mod memory;

pub use contracts::*;
