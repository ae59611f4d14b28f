//! The subcommands.

pub mod cluster;
pub mod crds;
pub mod manifests;
pub mod review;
pub mod serve;
pub mod status;
pub mod uninstall;
