//! The human-readable report printed by `kernelsight simulate`.

use crate::sim::metrics::Percentiles;
use crate::sim::summary::Summary;
use std::fmt::Write;

/// Thousands separators for counts.
pub fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn row(out: &mut String, name: &str, p: &Percentiles) {
    let _ = writeln!(out, "  {name:<8}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10.2}", p.mean, p.p50, p.p90, p.p95, p.p99, p.max);
}

/// `setup` lines (model, deployment, KV plan, workload) come first, as given.
pub fn render(setup: &[String], s: &Summary) -> String {
    let mut o = String::new();
    for line in setup {
        let _ = writeln!(o, "{line}");
    }
    let _ = writeln!(o);
    let rejected = if s.rejected == 0 {
        "0 rejected".to_string()
    } else {
        let why: Vec<String> = s.rejected_by_reason.iter().map(|(k, v)| format!("{v} {k}")).collect();
        format!("{} rejected ({})", s.rejected, why.join(", "))
    };
    let _ = writeln!(o, "Requests    {} arrived, {} completed, {rejected}", group(s.num_requests), group(s.completed));
    for (reason, limit) in &s.rejected_limits {
        let _ = writeln!(o, "            rejected {reason}: {limit}");
    }
    let _ = writeln!(o, "Duration    {:.2} s (simulated, to the last completion)", s.duration_s);
    let _ = writeln!(
        o,
        "Throughput  {:.2} req/s, {} output tok/s, {} total tok/s",
        s.request_throughput_rps,
        group(s.throughput_tok_s.round() as u64),
        group(s.total_throughput_tok_s.round() as u64)
    );
    if let Some(g) = s.goodput_rps {
        let mut slo = Vec::new();
        if let Some(t) = s.slo_ttft_ms {
            slo.push(format!("TTFT <= {t} ms"));
        }
        if let Some(t) = s.slo_tpot_ms {
            slo.push(format!("TPOT <= {t} ms"));
        }
        let share = if s.request_throughput_rps > 0.0 { g / s.request_throughput_rps * 100.0 } else { 0.0 };
        let _ = writeln!(o, "Goodput     {g:.2} req/s ({share:.1}% of completed) under {}", slo.join(" and "));
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "  {:<8}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}", "ms", "mean", "p50", "p90", "p95", "p99", "max");
    row(&mut o, "TTFT", &s.ttft_ms);
    row(&mut o, "TPOT", &s.tpot_ms);
    row(&mut o, "ITL", &s.itl_ms);
    row(&mut o, "E2E", &s.e2e_ms);
    row(&mut o, "Queue", &s.queue_ms);
    let _ = writeln!(o, "  {}", s.tpot_definition);
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Scheduler   {} steps, {:.1} sequences and {:.1} tokens per step on average, {} preemptions",
        group(s.steps),
        s.mean_batch_seqs,
        s.mean_batch_tokens,
        group(s.preemptions)
    );
    let _ = writeln!(
        o,
        "KV cache    {:.1}% used on average, {:.1}% peak; prefix-cache hit rate {:.1}% of prompt tokens",
        s.kv.mean_util * 100.0,
        s.kv.peak_util * 100.0,
        s.prefix_cache_hit_rate * 100.0
    );
    let shares: Vec<String> = s
        .kernel_time_share
        .iter()
        .filter(|(_, v)| **v > 0.0)
        .map(|(k, v)| format!("{k} {:.1}%", v * 100.0))
        .collect();
    let _ = writeln!(o, "Step time   {}", shares.join(", "));
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn groups_thousands() {
        assert_eq!(super::group(0), "0");
        assert_eq!(super::group(999), "999");
        assert_eq!(super::group(1000), "1,000");
        assert_eq!(super::group(1234567), "1,234,567");
    }
}
