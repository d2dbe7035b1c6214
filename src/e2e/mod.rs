//! End-to-end validation against measured serving runs.
pub mod silicon;
