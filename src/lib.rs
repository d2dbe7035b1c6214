//! kernelsight: predicts how an LLM serves on a GPU deployment, down to each kernel.
//! See `docs/ARCHITECTURE.md` for the data flow.

pub mod cli;
pub mod hardware;
pub mod ingest;
pub mod model;
pub mod schema;
