//! Parses batch specs such as `prefill:2x512,decode:64@2048`: 2 prompts of 512 new tokens and 64
//! decodes with 2048 cached tokens each. `prefill:1x256@1024` is a 256-token chunk on top of
//! 1024 cached tokens.

use crate::perf::SeqWork;
use anyhow::{bail, Context, Result};

const FORM: &str = "expected a comma-separated list of prefill:COUNTxTOKENS[@CACHED] and decode:COUNT@CACHED, e.g. prefill:2x512,decode:64@2048";

fn num(s: &str, what: &str, item: &str) -> Result<u32> {
    let v: u64 = s.trim().parse().with_context(|| format!("batch item '{item}': {what} '{s}' is not a whole number; {FORM}"))?;
    if v == 0 || v > u32::MAX as u64 {
        bail!("batch item '{item}': {what} must be between 1 and {}; {FORM}", u32::MAX);
    }
    Ok(v as u32)
}

pub fn parse_batch_spec(spec: &str) -> Result<Vec<SeqWork>> {
    let mut seqs = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((kind, rest)) = item.split_once(':') else { bail!("batch item '{item}' has no 'kind:'; {FORM}") };
        match kind.trim() {
            "prefill" => {
                let (shape, cached) = match rest.split_once('@') {
                    Some((a, b)) => (a, b.trim().parse::<u32>().with_context(|| format!("batch item '{item}': cached tokens '{b}' is not a whole number; {FORM}"))?),
                    None => (rest, 0),
                };
                let Some((count, tokens)) = shape.split_once('x') else { bail!("batch item '{item}': prefill needs COUNTxTOKENS; {FORM}") };
                let (count, tokens) = (num(count, "count", item)?, num(tokens, "tokens", item)?);
                seqs.extend(std::iter::repeat_n(SeqWork { new_tokens: tokens, cached_tokens: cached }, count as usize));
            }
            "decode" => {
                let Some((count, cached)) = rest.split_once('@') else { bail!("batch item '{item}': decode needs COUNT@CACHED; {FORM}") };
                let (count, cached) = (num(count, "count", item)?, num(cached, "cached tokens", item)?);
                seqs.extend(std::iter::repeat_n(SeqWork { new_tokens: 1, cached_tokens: cached }, count as usize));
            }
            other => bail!("batch item '{item}': unknown kind '{other}' (allowed: prefill, decode); {FORM}"),
        }
    }
    if seqs.is_empty() {
        bail!("empty batch spec; {FORM}");
    }
    Ok(seqs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mixed_batches() {
        let s = parse_batch_spec("prefill:2x512,decode:3@2048,prefill:1x256@1024").unwrap();
        assert_eq!(s.len(), 6);
        assert_eq!(s[0], SeqWork { new_tokens: 512, cached_tokens: 0 });
        assert_eq!(s[2], SeqWork { new_tokens: 1, cached_tokens: 2048 });
        assert_eq!(s[5], SeqWork { new_tokens: 256, cached_tokens: 1024 });
    }

    #[test]
    fn errors_show_the_expected_form() {
        for bad in ["", "prefill:2", "decode:64", "foo:1x2", "prefill:0x5", "prefill:ax5", "decode:2@x"] {
            let e = format!("{:#}", parse_batch_spec(bad).unwrap_err());
            assert!(e.contains("prefill:2x512,decode:64@2048"), "{bad}: {e}");
        }
    }
}
