//! One file per subcommand; each parses its flags and calls the library.
pub mod bench;
pub mod common;
pub mod calibrate;
pub mod capacity;
pub mod hw;
pub mod import;
pub mod kernel;
pub mod microbench;
pub mod models;
pub mod plan;
pub mod simulate;
pub mod sol;
pub mod step;
pub mod validate;
pub mod workload;
