//! The command line: its flags and subcommands, and what each subcommand
//! does with the library.

pub mod agent;
pub mod bmc;
pub mod hosts;
pub mod import;
pub mod leases;
pub mod oob;
pub mod run;
pub mod runtime;
pub mod stats;
pub mod trace;
