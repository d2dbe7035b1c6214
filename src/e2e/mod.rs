//! End-to-end validation: replay measured serving runs in the simulator and report how far
//! the predicted TTFT, TPOT, ITL and throughput are from the measurements.

pub mod cli;
pub mod host_fit;
pub mod kv_capacity;
pub mod load_sweep;
pub mod model_folders;
pub mod peak_memory;
pub mod regression;
pub mod repeatability;
pub mod replay;
pub mod silicon;
pub mod static_steps;
pub mod stats;
pub mod step_gpu;
pub mod step_states;
pub mod traces;
pub mod traces_report;
