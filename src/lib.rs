//! kernelsight: predicts how an LLM serves on a GPU deployment, down to each kernel.
//! See `docs/ARCHITECTURE.md` for the data flow.

pub mod batch_spec;
pub mod calibrate;
pub mod cli;
pub mod deployment;
pub mod e2e;
pub mod hardware;
pub mod headroom;
pub mod ingest;
pub mod kernels;
pub mod microbench;
pub mod model;
pub mod perf;
pub mod plan;
pub mod quantile;
pub mod report;
pub mod schema;
pub mod sim;
pub mod workload;
