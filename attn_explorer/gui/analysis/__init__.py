"""The Analyses tab: one page per analysis (overview, rollout, norms, search, compare, lines)."""
