"""Analyses of attention that go beyond looking at one head: pure functions, NumPy in and NumPy out.

- `rollout`: attention rollout through the layers (Abnar & Zuidema 2020).
- `norms`: value-weighted norms ‖α_ij f_h(x_j)‖ (Kobayashi et al. 2020), from a model's own W_V and W_O.
- `stats`: one number per head (entropy, sinks, distance, previous/next-token share), for the overview.
- `compare`: the signed difference of two runs' attention, when their shapes agree.
- `search`: heads ranked by how much weight they put where a target pattern says.

No Qt here (import-linter checks it). The GUI reaches these through `session.analysis`.
"""
from __future__ import annotations

ANALYSES = ("rollout", "norms", "stats", "compare", "search")
