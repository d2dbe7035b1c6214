//! gemm, rmsnorm (and fused_add_rmsnorm), rope, sampling.

use super::{narrowest, Counts, Ctx, WorkCost};
use crate::headroom::bound::OpClass;
use anyhow::Result;

/// C[M,N] = A[M,K] @ B[N,K]^T: 2MNK FLOPs, A, B and C moved once.
pub(super) fn gemm(c: &Ctx) -> Result<WorkCost> {
    let (m, n, k) = (c.axis("M")?, c.axis("N")?, c.axis("K")?);
    let dtype = narrowest(c.dtype("A")?, c.dtype("B")?);
    let counts = Counts { flops: 2.0 * m * n * k, bytes: c.io_bytes_except(&[]) };
    Ok(WorkCost::exact(OpClass::Gemm, dtype, counts))
}

/// Every declared tensor moved once; no tensor-core work.
pub(super) fn rmsnorm(c: &Ctx) -> Result<WorkCost> {
    let dtype = c.dtype("hidden_states")?;
    let mut w = WorkCost::exact(OpClass::Elementwise, dtype, Counts { flops: 0.0, bytes: c.io_bytes_except(&[]) });
    if c.has("residual") {
        w.notes.push(
            "counts the definition's outputs only; FlashInfer's fused_add_rmsnorm also writes the \
             residual in place (one more [batch_size, hidden_size] tensor)"
                .into(),
        );
    }
    Ok(w)
}

/// In-place rotary embedding: only the `rotary_dim` lanes of q and k are read and written;
/// each token reads its position and one cos/sin row.
pub(super) fn rope(c: &Ctx) -> Result<WorkCost> {
    let t = c.axis("num_tokens")?;
    let heads = c.axis("num_qo_heads")? + c.axis("num_kv_heads")?;
    let rd = c.axis("rotary_dim")?;
    let qb = c.elem_bytes("q", c.tensor("q")?);
    let row = rd * c.elem_bytes("cos_sin_cache", c.tensor("cos_sin_cache")?);
    let lanes = 2.0 * t * heads * rd * qb + c.bytes_of("positions")?;
    let distinct_rows = t.min(c.axis("max_seq_len")?.max(1.0));
    let mut w = WorkCost::exact(OpClass::Elementwise, c.dtype("q")?, Counts { flops: 0.0, bytes: lanes + row });
    w.nominal.bytes = lanes + distinct_rows * row;
    w.notes.push(format!(
        "in-place API: only the rotary_dim = {rd} lanes of q and k move; the other head_size - rotary_dim lanes stay put"
    ));
    w.missing.push(c.missing(&["positions"], "distinct positions; the bound reads one cos/sin row in all, nominal one per token"));
    Ok(w)
}

/// Every probability must be read to find the top-k/top-p set; one sample written per row.
pub(super) fn sampling(c: &Ctx) -> Result<WorkCost> {
    let dtype = c.dtype("probs")?;
    Ok(WorkCost::exact(OpClass::Elementwise, dtype, Counts { flops: 0.0, bytes: c.io_bytes_except(&[]) }))
}
