//! Resource arithmetic: Kubernetes quantities and resource lists.

pub mod list;
pub mod quantity;
pub mod strategic_merge;

pub use list::Resources;
pub use quantity::{Format, Qty, QuantityError};
