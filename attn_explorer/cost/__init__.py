"""The cost lab: attention's time and memory against sequence length, measured, never drawn from a formula.

memory.py measures and predicts peak memory and sets the budget; measure.py streams one record per
(n, variant); fit.py fits the log-log slopes; cli.py is `attn-explorer cost`. No Qt here, and no
torch import at package level (the CLI imports this package on every start).
"""
