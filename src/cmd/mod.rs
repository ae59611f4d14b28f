//! The subcommands.

pub mod audit;
mod deployed;
pub mod doc_tables;
pub mod manifests;
pub mod resolved;
pub mod review;
pub mod serve;
pub mod status;
pub mod uninstall;
