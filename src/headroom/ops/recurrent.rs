//! Recurrent state-space ops: gdn (Gated DeltaNet decode, MTP, chunked prefill) and mamba_ssu
//! (Mamba-2 selective state update). Both are dominated by reading and writing the state.

use super::{Counts, Ctx, WorkCost};
use crate::headroom::bound::OpClass;
use anyhow::Result;

/// Per token and value head the delta rule does k.S, a rank-1 update of S and q.S, each a
/// d x d multiply-add: 6 d^2 FLOPs (the recurrent count; chunked kernels do more).
pub(super) fn gdn(c: &Ctx) -> Result<WorkCost> {
    let (hv, d) = (c.axis("num_v_heads")?, c.axis("head_size")?);
    let per_token = 6.0 * hv * d * d;
    let dtype = c.dtype("q")?;
    if c.has("initial_state_indices") {
        // MTP: B requests of seq_len draft tokens, states gathered from a pool by index.
        let (b, t) = (c.axis("batch_size")?, c.axis("seq_len")?);
        let state = |name: &str| -> Result<f64> { Ok(hv * d * d * c.elem_bytes(name, c.tensor(name)?)) };
        let io = c.io_bytes_except(&["initial_state", "final_state", "intermediate_states_buffer"]);
        let bytes = io + b * state("initial_state")? + b * t * state("intermediate_states_buffer")?;
        let mut w = WorkCost::exact(OpClass::Recurrent, dtype, Counts { flops: per_token * b * t, bytes });
        w.notes.push(
            "reads one pool state per request and writes seq_len intermediate states per request (as the \
             reference does); final_state is left unchanged by the reference (disable_state_update), so it is not counted"
                .into(),
        );
        w.notes.push("assumes distinct state slots per request".into());
        w.missing.push(c.missing(&["initial_state_indices"], "which pool slots are used"));
        return Ok(w);
    }
    let tokens = if c.has("cu_seqlens") {
        c.axis("total_seq_len")?
    } else {
        c.axis("batch_size")? * c.axis("seq_len")?
    };
    let mut w = WorkCost::exact(OpClass::Recurrent, dtype, Counts { flops: per_token * tokens, bytes: c.io_bytes_except(&[]) });
    if c.has("cu_seqlens") {
        w.notes.push("FLOPs are the recurrent count; chunked prefill kernels do more work for parallelism".into());
    }
    Ok(w)
}

/// Each request reads and writes its state slot [nheads, head_dim, dstate]; the readout
/// y = C . state contracts over dstate.
pub(super) fn mamba_ssu(c: &Ctx) -> Result<WorkCost> {
    let b = c.axis("batch_size")?;
    let slot = c.axis("nheads")? * c.axis("head_dim")? * c.axis("dstate")?;
    let state_b = c.elem_bytes("state", c.tensor("state")?);
    let io = c.io_bytes_except(&["state", "new_state"]);
    let counts = Counts { flops: 2.0 * b * slot, bytes: io + 2.0 * b * slot * state_b };
    let mut w = WorkCost::exact(OpClass::Recurrent, c.dtype("x")?, counts);
    w.notes.push("assumes every request has its own valid state slot (state_batch_indices >= 0, distinct)".into());
    w.missing.push(c.missing(&["state_batch_indices"], "which state slots are used"));
    Ok(w)
}
