//! What a review may cost in memory, counted by the allocator rather than guessed from its shape.
//!
//! - [`estimate`]: the memory a body will take once decoded, read off its bytes before decoding (the
//!   server takes that much from its decode budget before it decodes anything).
//! - [`counting`]: the process's allocator, which counts every thread's live bytes, and a [`Meter`]
//!   that gives the code running on one thread a limit of its own.
//! - [`metered`]: a serde deserializer wrapper that looks at the meter at every value and stops the
//!   decode with an error once its limit is passed, so a shape nobody thought of (a struct that is
//!   large when empty, repeated in an array) is refused instead of allocated.
//!
//! Together they make the decode's bound hold by construction: the estimate decides what a review
//! is allowed, the allocator measures what it takes, and the decode stops at the first value past it.

pub mod counting;
pub mod estimate;
pub mod metered;

pub use counting::{Meter, OverLimit};
pub use estimate::{BodyShape, decode_allowance, decoded_estimate};
