"""The cost lab: attention's time and memory against sequence length, measured, never drawn from a formula.

variants.py is the one registry of attention variants (names, colours, kernels, memory formulas);
config.py says what a sweep measures; memory.py measures peak memory and sets the budget;
measure.py streams one record per (n, variant) with interleaved timed runs; fit.py fits the log-log
slopes over the large-n range and judges whether timings are noisy; estimate.py estimates the time
left; real.py measures the variants on a model's own q, k, v. The CLI is cli/cost.py. No Qt here,
and no torch import at package level (the CLI imports this package on every start).
"""
