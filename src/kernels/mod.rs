//! Kernel cost accounting and the graph that expands (model, deployment, batch) into kernels.
pub mod cost;
pub mod dispatch_chain;
pub mod graph;
pub mod memory;
pub mod row_tiles;
