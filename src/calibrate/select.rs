//! Model choice for op families measured on few GPUs. With two or three training GPUs the tree
//! correction can learn each GPU's identity from its spec-sheet features instead of anything
//! that transfers, and then predicts a new GPU worse than the physical base alone. Which of the
//! two to ship is decided by an inner leave-one-GPU-out over the training GPUs only: the GPU a
//! cross-gen model is for is never looked at.
//!
//! Candidates differ by family. Collectives: the learned form or the per-link-class base (their
//! features name the link and the message, nothing that identifies a GPU; the roofline form,
//! one efficiency over every link class, is not offered). Every other family: the base or the
//! roofline form only. Its features include spec-sheet rates, which on two or three GPUs cannot
//! be told apart from GPU identity (`picks_the_base_when_the_correction_is_gpu_identity`); this
//! rule was set after seeing the leave-one-GPU-out table, where trees fitted on those GPUs
//! transferred worst in every elementwise family. Elementwise families may also take the
//! two-resource base (DRAM bandwidth and SM count x clock, fitted per library over the training
//! GPUs together), where an inner fold could fit it and it predicted better there.

use super::dataset::Measurement;
use super::model::{base_key, FitParams, Form, OpModel};
use crate::hardware::GpuSpec;
use crate::quantile::upper_median;
use crate::schema::Op;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Op families trained on at most this many GPUs get the inner check; with more GPUs the trees
/// see enough spread of spec sheets (and the check would cost a fit per GPU on the big families).
pub const MAX_GPUS_FOR_CHECK: usize = 3;

/// Fewest rows of the op on a training GPU for it to be left out in the inner check (a handful
/// of rows gives a median that is noise); it still trains the other inner folds.
pub const MIN_INNER_ROWS: usize = 50;

/// Mean over the inner held-out GPUs of each GPU's median |ln(predicted / measured)|, for each
/// form: every GPU counts once, as every held-out GPU does in the outer validation. The log
/// error is the loss the models are fitted in and, unlike APE (which cannot exceed 100 % for a
/// prediction that is too fast), it weighs too fast and too slow alike.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct InnerCheck {
    pub gpus: usize,
    pub learned_log_err: f64,
    pub base_only_log_err: f64,
    pub roofline_log_err: f64,
    /// Elementwise families: the two-resource form (the base alone for libraries whose fold's
    /// training GPUs could not pin it, so it ties with the base where no fold could).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub two_resource_log_err: Option<f64>,
}

impl InnerCheck {
    /// The candidate form with the lowest inner error (ties go to the simpler one).
    pub fn best(&self, candidates: &[Form]) -> Form {
        let err = |f: &Form| match f {
            Form::Learned => self.learned_log_err,
            Form::BaseOnly => self.base_only_log_err,
            Form::TwoResource => self.two_resource_log_err.unwrap_or(f64::INFINITY),
            Form::Roofline => self.roofline_log_err,
        };
        // Candidates are listed most complex first; `min_by` keeps the first of equal errors, so
        // walking them in reverse breaks ties toward the simpler form.
        candidates.iter().rev().copied().min_by(|a, b| err(a).total_cmp(&err(b))).unwrap_or(Form::BaseOnly)
    }
}

/// The forms the inner check may choose for `op`, most complex first.
pub fn candidates(op: Op) -> &'static [Form] {
    if op.is_collective() {
        &[Form::Learned, Form::BaseOnly]
    } else if op.class() == "elementwise" {
        &[Form::TwoResource, Form::BaseOnly, Form::Roofline]
    } else {
        &[Form::BaseOnly, Form::Roofline]
    }
}

/// `model` (fitted on `rows`) with its form chosen by the inner check where its training GPUs
/// are few: whichever candidate form predicted the left-out training GPUs best; the base alone
/// when no training GPU has enough rows to be left out. A model without the learned form drops
/// its trees, one without the two-resource form its two-resource bases.
pub fn checked<'a>(mut model: OpModel, rows: &[&Measurement], spec: &dyn Fn(&str) -> &'a GpuSpec, params: &FitParams) -> OpModel {
    let gpus: BTreeSet<&str> = rows.iter().map(|m| m.gpu.as_str()).collect();
    if gpus.len() > MAX_GPUS_FOR_CHECK {
        model.two_resource.clear();
        return model.without_issue_bound().without_launch_floors();
    }
    let check = inner_check(&model, rows, &gpus, spec, params);
    model.form = check.map(|c| c.best(candidates(model.op))).unwrap_or(Form::BaseOnly);
    model.inner_check = check;
    // A model keeps only what its form predicts with.
    if model.form != Form::TwoResource {
        model.two_resource.clear();
    }
    if !matches!(model.form, Form::TwoResource | Form::BaseOnly) {
        model = model.without_issue_bound();
    }
    if model.form != Form::Roofline {
        model = model.without_launch_floors();
    }
    if model.form != Form::Learned {
        model.gbdt.clear_trees();
        for sub in model.by_path.values_mut() {
            sub.gbdt.clear_trees();
        }
    }
    model
}

fn inner_check<'a>(
    model: &OpModel,
    rows: &[&Measurement],
    gpus: &BTreeSet<&str>,
    spec: &dyn Fn(&str) -> &'a GpuSpec,
    params: &FitParams,
) -> Option<InnerCheck> {
    if gpus.len() < 2 {
        return None;
    }
    // Rows of each (GPU, base key), for the representation rule below.
    let mut key_rows: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for m in rows {
        *key_rows.entry((m.gpu.as_str(), base_key(model.op, spec(&m.gpu), &m.kernel, &m.backend))).or_insert(0) += 1;
    }
    let with_two_resource = candidates(model.op).contains(&Form::TwoResource);
    let (mut learned, mut base, mut roof, mut two) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &h in gpus {
        let test: Vec<&Measurement> = rows.iter().copied().filter(|m| m.gpu == h).collect();
        if test.len() < MIN_INNER_ROWS {
            continue;
        }
        // Outside collectives, a GPU is left out only if every base its rows use (elementwise
        // ops: its DRAM kind) is still fitted on at least MIN_INNER_ROWS rows of another
        // training GPU. Otherwise the fold tests a transfer the shipped model never makes (the
        // only GDDR card predicted from HBM GPUs, or the only HBM GPU with Vidur rows from a
        // handful of rows of another kernel library), and its error says nothing about which
        // form carries to the GPU the model is for.
        if !model.op.is_collective() {
            let own_keys: BTreeSet<&String> = key_rows.keys().filter(|(g, _)| *g == h).map(|(_, k)| k).collect();
            let represented = |k: &String| key_rows.iter().any(|((g, k2), n)| *g != h && k2 == k && *n >= MIN_INNER_ROWS);
            if !own_keys.into_iter().all(represented) {
                continue;
            }
        }
        let train: Vec<&Measurement> = rows.iter().copied().filter(|m| m.gpu != h).collect();
        let mut inner = OpModel::fit(model.op, &train, spec, params);
        // Elementwise rows are scored only where the fold's training GPUs measured their
        // library: the form decides how a library's own base carries to a new GPU, the transfer
        // the shipped model makes for every library its training GPUs measured. A library the
        // fold never saw is priced from another library's kernels whatever the form, and with
        // few GPUs those rows can outvote the rest (torch's index_select embedding, on H100
        // and H200, was priced at 5x on the H100 by the roofline form that Vidur's A100 rows,
        // predicted from the H200's other libraries, had chosen).
        let test: Vec<&Measurement> = if model.op.class() == "elementwise" {
            test.into_iter().filter(|m| inner.has_library_base(spec(&m.gpu), &m.kernel, &m.backend)).collect()
        } else {
            test
        };
        if test.len() < MIN_INNER_ROWS {
            continue;
        }
        let (mut l, mut b, mut r, mut t) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for m in &test {
            let g = spec(&m.gpu);
            let err = |p: f64| (p / m.latency_us).ln().abs();
            inner.form = Form::Learned;
            l.push(err(inner.predict_routed_us(&m.kernel, g, Some(&m.backend), m.routing)));
            inner.form = Form::BaseOnly;
            b.push(err(inner.predict_routed_us(&m.kernel, g, Some(&m.backend), m.routing)));
            inner.form = Form::Roofline;
            r.push(err(inner.predict_routed_us(&m.kernel, g, Some(&m.backend), m.routing)));
            if with_two_resource {
                inner.form = Form::TwoResource;
                t.push(err(inner.predict_routed_us(&m.kernel, g, Some(&m.backend), m.routing)));
            }
        }
        learned.push(upper_median(&mut l).expect("a fold has MIN_INNER_ROWS rows"));
        base.push(upper_median(&mut b).expect("a fold has MIN_INNER_ROWS rows"));
        roof.push(upper_median(&mut r).expect("a fold has MIN_INNER_ROWS rows"));
        if with_two_resource {
            two.push(upper_median(&mut t).expect("a fold has MIN_INNER_ROWS rows"));
        }
    }
    if learned.is_empty() {
        return None;
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    Some(InnerCheck {
        gpus: learned.len(),
        learned_log_err: mean(&learned),
        base_only_log_err: mean(&base),
        roofline_log_err: mean(&roof),
        two_resource_log_err: with_two_resource.then(|| mean(&two)),
    })
}

#[cfg(test)]
mod tests {
    use crate::kernels::cost::Routing;
    use super::*;
    use crate::calibrate::base::TwoResourceBase;
    use crate::hardware::load_gpu;
    use crate::perf::sol::sol;
    use crate::schema::{Dtype, Kernel};

    /// rmsnorm rows on three GPUs: `t = 3 us + SOL * 1.25 * factor(gpu, shape)`.
    fn rows(factor: impl Fn(&str, &Kernel) -> f64) -> (Vec<Measurement>, Vec<GpuSpec>) {
        let specs: Vec<GpuSpec> = ["a100_sxm", "h100_sxm", "b200_sxm"].iter().map(|g| load_gpu(g).unwrap()).collect();
        let mut out = Vec::new();
        for g in &specs {
            for t in [1u64, 2, 4, 16, 64, 256, 1024, 2048, 4096, 16384] {
                for h in [1024u64, 2048, 4096, 6144, 8192, 16384] {
                    let mut k = Kernel::new(Op::Rmsnorm, Dtype::Bf16);
                    k.num_tokens = t;
                    k.hidden = h;
                    let s = sol(&k, g).sol_us;
                    let latency_us = 3.0 + s * 1.25 * factor(&g.id, &k);
                    out.push(Measurement { routing: Routing::Uniform, kernel: k, gpu: g.id.clone(), backend: "lib".into(), source: "synthetic".into(), latency_us });
                }
            }
        }
        (out, specs)
    }

    fn fit_checked(data: &[Measurement], specs: &[GpuSpec]) -> OpModel {
        let spec = |g: &str| specs.iter().find(|s| s.id == g).unwrap();
        let refs: Vec<&Measurement> = data.iter().collect();
        let params = FitParams::default();
        checked(OpModel::fit(Op::Rmsnorm, &refs, &spec, &params), &refs, &spec, &params)
    }

    #[test]
    fn picks_the_base_when_the_correction_is_gpu_identity() {
        // Width slows A100 down and speeds H100 up, B200 not at all: a per-GPU quirk with no
        // trace on the spec sheets. The trees learn it by GPU identity and hand the neighbour's
        // quirk to whichever GPU is left out; the base (one latency, one efficiency) does not.
        let (data, specs) = rows(|g, k| {
            let w = (k.hidden as f64 / 4096.0).sqrt();
            match g {
                "a100_sxm" => w,
                "h100_sxm" => 1.0 / w,
                _ => 1.0,
            }
        });
        let m = fit_checked(&data, &specs);
        let c = m.inner_check.expect("three GPUs: checked");
        assert_eq!(c.gpus, 3);
        assert!(c.base_only_log_err < c.learned_log_err, "{c:?}");
        assert_ne!(m.form, Form::Learned);
        assert!(m.gbdt.trees.is_empty());
    }

    #[test]
    fn the_inner_check_sees_a_transferable_correction() {
        // Every GPU slows down with width as sqrt(hidden / 4096): a shape effect the base (one
        // latency, one efficiency) cannot express and the trees carry to a left-out GPU.
        let (data, specs) = rows(|_, k| (k.hidden as f64 / 4096.0).sqrt());
        let m = fit_checked(&data, &specs);
        let c = m.inner_check.expect("checked");
        // The trees carry the width effect to each left-out GPU; the base cannot express it.
        assert!(c.learned_log_err < c.base_only_log_err, "{c:?}");
        assert_eq!(c.best(&[Form::Learned, Form::BaseOnly]), Form::Learned);
        // An elementwise family still ships a physical form (see the module comment).
        assert_ne!(m.form, Form::Learned);
    }

    #[test]
    fn a_gpu_alone_on_its_dram_kind_is_not_left_out() {
        // rmsnorm on H100 and H200 (HBM) and A40 (GDDR), 60 rows each. Leaving out A40 would
        // predict the only GDDR card from HBM bases, which the shipped model never does; H100
        // and H200 each still have the other on their kind: two inner folds.
        let specs: Vec<GpuSpec> = ["h100_sxm", "h200_sxm", "a40"].iter().map(|g| load_gpu(g).unwrap()).collect();
        let spec = |g: &str| specs.iter().find(|s| s.id == g).unwrap();
        let mut data = Vec::new();
        for g in &specs {
            for t in [1u64, 4, 16, 64, 256, 1024, 2048, 4096, 8192, 16384] {
                for h in [1024u64, 2048, 4096, 6144, 8192, 16384] {
                    let k = Kernel { num_tokens: t, hidden: h, ..Kernel::new(Op::Rmsnorm, Dtype::Bf16) };
                    let latency_us = 3.0 + 2.0 * sol(&k, g).sol_us;
                    data.push(Measurement { routing: Routing::Uniform, kernel: k, gpu: g.id.clone(), backend: "lib".into(), source: "s".into(), latency_us });
                }
            }
        }
        let params = FitParams::default();
        let fit = |keep: &dyn Fn(&str) -> bool| {
            let refs: Vec<&Measurement> = data.iter().filter(|m| keep(&m.gpu)).collect();
            checked(OpModel::fit(Op::Rmsnorm, &refs, &spec, &params), &refs, &spec, &params)
        };
        assert_eq!(fit(&|_| true).inner_check.expect("two HBM GPUs").gpus, 2);
        // H100 and A40 only: no GPU shares its kind with another, so no check; the base ships.
        let m = fit(&|g| g != "h200_sxm");
        assert!(m.inner_check.is_none(), "{:?}", m.inner_check);
        assert_eq!(m.form, Form::BaseOnly);
    }

    /// rmsnorm by one library on A100 and H100 (HBM) and A40 (GDDR), 60 rows each, timed by
    /// `time_us(gpu, bytes)`.
    fn three_balances(time_us: impl Fn(&GpuSpec, f64) -> f64) -> OpModel {
        let specs: Vec<GpuSpec> = ["a100_sxm", "h100_sxm", "a40"].iter().map(|g| load_gpu(g).unwrap()).collect();
        let spec = |g: &str| specs.iter().find(|s| s.id == g).unwrap();
        let mut data = Vec::new();
        for g in &specs {
            for t in [1u64, 4, 16, 64, 256, 1024, 2048, 4096, 8192, 16384] {
                for h in [1024u64, 2048, 4096, 6144, 8192, 16384] {
                    let k = Kernel { num_tokens: t, hidden: h, ..Kernel::new(Op::Rmsnorm, Dtype::Fp16) };
                    let latency_us = time_us(g, sol(&k, g).bytes);
                    data.push(Measurement { routing: Routing::Uniform, kernel: k, gpu: g.id.clone(), backend: "vidur/rmsnorm".into(), source: "s".into(), latency_us });
                }
            }
        }
        let refs: Vec<&Measurement> = data.iter().collect();
        let params = FitParams::default();
        checked(OpModel::fit(Op::Rmsnorm, &refs, &spec, &params), &refs, &spec, &params)
    }

    #[test]
    fn picks_the_two_resource_base_when_it_transfers() {
        // One law on every GPU, SM-issue-bound on the HBM GPUs: 2 us + max(0.3 x bytes / DRAM
        // bandwidth, 0.2 SM cycles per byte). Left out, A100 (H100) is predicted from H100 (A100) and A40;
        // the HBM base scales the other HBM GPU by bandwidth and misses the SM-cycle share.
        let law = TwoResourceBase { latency_us: 2.0, inv_dram_efficiency: 0.3, sm_cycles_per_byte: 0.2 };
        let m = three_balances(|g, bytes| law.time_us(bytes, g));
        let c = m.inner_check.expect("A100 and H100 each have the other on HBM");
        assert_eq!(c.gpus, 2);
        assert!(c.two_resource_log_err.unwrap() < c.base_only_log_err, "{c:?}");
        assert_eq!(m.form, Form::TwoResource);
    }

    #[test]
    fn keeps_the_dram_kind_base_when_the_two_resource_base_does_not_transfer() {
        // Bandwidth-bound on every GPU at a fraction of spec set by the DRAM kind (HBM 1/3,
        // GDDR 0.6): the HBM GPUs agree, and a two-resource law fitted on one of them and A40
        // reads A40's better fraction as an SM-cycle term the other HBM GPU does not have.
        let m = three_balances(|g, bytes| {
            let inv_eff = if g.memory.dram == crate::hardware::DramKind::Gddr { 1.0 / 0.6 } else { 3.0 };
            3.0 + 1e6 * inv_eff * bytes / g.hbm_bytes_per_s()
        });
        let c = m.inner_check.expect("checked");
        assert!(c.base_only_log_err < c.two_resource_log_err.unwrap(), "{c:?}");
        assert_eq!(m.form, Form::BaseOnly);
    }

    #[test]
    fn a_library_no_other_training_gpu_measured_does_not_choose_the_form() {
        // rmsnorm on A100 and H100: library "a" on A100 only, "b" on H100 only, 60 rows each,
        // at different efficiencies. Each fold could only price the left-out GPU's library from
        // the other library's kernels, whatever the form: no fold is scored, the base ships.
        let specs: Vec<GpuSpec> = ["a100_sxm", "h100_sxm"].iter().map(|g| load_gpu(g).unwrap()).collect();
        let spec = |g: &str| specs.iter().find(|s| s.id == g).unwrap();
        let mut data = Vec::new();
        for (g, lib, inv_eff) in [(&specs[0], "a", 1.2), (&specs[1], "b", 4.0), (&specs[0], "shared", 2.0), (&specs[1], "shared", 2.0)] {
            for t in [1u64, 4, 16, 64, 256, 1024, 2048, 4096, 8192, 16384] {
                for h in [1024u64, 2048, 4096, 6144, 8192, 16384] {
                    let k = Kernel { num_tokens: t, hidden: h, ..Kernel::new(Op::Rmsnorm, Dtype::Bf16) };
                    let latency_us = 3.0 + inv_eff * sol(&k, g).sol_us;
                    data.push(Measurement { routing: Routing::Uniform, kernel: k, gpu: g.id.clone(), backend: lib.into(), source: "s".into(), latency_us });
                }
            }
        }
        let params = FitParams::default();
        let fit = |keep: &dyn Fn(&Measurement) -> bool| {
            let refs: Vec<&Measurement> = data.iter().filter(|m| keep(m)).collect();
            checked(OpModel::fit(Op::Rmsnorm, &refs, &spec, &params), &refs, &spec, &params)
        };
        let m = fit(&|m| m.backend != "shared");
        assert!(m.inner_check.is_none(), "{:?}", m.inner_check);
        assert_eq!(m.form, Form::BaseOnly);
        // With a library both GPUs measured, each fold scores that library's rows.
        let c = fit(&|_| true).inner_check.expect("the shared library is scored");
        assert_eq!(c.gpus, 2);
        assert!(c.base_only_log_err < 0.05, "{c:?}");
    }

    #[test]
    fn best_prefers_the_simpler_form_on_ties() {
        let c = InnerCheck { gpus: 2, learned_log_err: 0.1, base_only_log_err: 0.1, roofline_log_err: 0.3, two_resource_log_err: Some(0.1) };
        assert_eq!(c.best(candidates(Op::Rmsnorm)), Form::BaseOnly);
        assert_eq!(c.best(&[Form::Learned, Form::BaseOnly]), Form::BaseOnly);
        assert_eq!(c.best(&[Form::BaseOnly, Form::Roofline]), Form::BaseOnly);
        let c = InnerCheck { roofline_log_err: 0.05, ..c };
        assert_eq!(c.best(&[Form::BaseOnly, Form::Roofline]), Form::Roofline);
        assert_eq!(candidates(Op::P2p), &[Form::Learned, Form::BaseOnly]);
    }

    #[test]
    fn one_training_gpu_falls_back_to_the_base() {
        let (data, specs) = rows(|_, _| 1.0);
        let one: Vec<Measurement> = data.into_iter().filter(|m| m.gpu == "a100_sxm").collect();
        let m = fit_checked(&one, &specs);
        assert_eq!(m.form, Form::BaseOnly);
        assert!(m.inner_check.is_none());
    }
}
