//! The subcommands.

pub mod audit;
pub mod manifests;
pub mod review;
pub mod serve;
pub mod status;
pub mod uninstall;
