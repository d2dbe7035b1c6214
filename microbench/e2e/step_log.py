"""The serving engine core's step log (`plugin/ks_vllm_hooks.py`), as the analysis scripts read it."""
import gzip
import os

import pandas as pd


def open_text(path):
    """`path` (gzipped if it ends in .gz), or `path.gz` where only the compressed copy is kept
    (the committed runs)."""
    if not os.path.exists(path):
        path += ".gz"
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def decode_steps(path):
    """The log's steps with `period_us` (start to the engine core's next start) and
    `between_decodes`: decode steps between two decode steps whose period is not an idle
    spell (with async scheduling a prompt step's GPU work runs on into the next period)."""
    with open_text(path) as f:
        d = pd.read_csv(f)
    d = d.sort_values(["pid", "t_start_mono_s"]).reset_index(drop=True)
    d["period_us"] = d.groupby("pid").t_start_mono_s.diff().shift(-1) * 1e6
    d.loc[d.pid != d.pid.shift(-1), "period_us"] = float("nan")
    dec = (d.tokens == d.reqs) & (d.reqs > 0)
    same_pid = (d.pid == d.pid.shift(1)) & (d.pid == d.pid.shift(-1))
    d["between_decodes"] = dec & dec.shift(1, fill_value=False) & dec.shift(-1, fill_value=False) & same_pid \
        & (d.period_us < 1e5) & d.execute_gpu_span_us.notna()
    return d
