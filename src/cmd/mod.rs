//! The subcommands.

pub mod crds;
pub mod review;
pub mod serve;
