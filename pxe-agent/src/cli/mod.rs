//! The command line: its flags and subcommands, and what each subcommand
//! does with the library.

pub mod import;
