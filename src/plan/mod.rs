//! Capacity planning: which deployments (GPU type, parallelism, precision, engine limits,
//! colocated or disaggregated prefill/decode) serve a workload within latency targets, what
//! the cheapest one costs, and how much load one deployment sustains.
//!
//! `space` enumerates and prunes candidates, an `Evaluator` simulates each, `search` checks
//! the SLOs and ranks, `capacity` searches the highest sustainable arrival rate.

pub mod candidate;
pub mod capacity;
pub mod evaluate;
pub mod frontier;
pub mod plot;
pub mod report;
pub mod sim_eval;
pub mod search;
pub mod slo;
pub mod space;
