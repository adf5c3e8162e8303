"""The relevance methods' names and titles, without torch: the window's method chooser reads them at start."""
from __future__ import annotations

METHODS = ("gradient_rollout", "attnlrp", "rollout", "attention")
METHOD_TITLES = {
    "gradient_rollout": "gradient rollout (Chefer et al. 2021)",
    "attnlrp": "AttnLRP subset (gradient × input with LRP rules)",
    "rollout": "attention rollout (Abnar & Zuidema 2020)",
    "attention": "raw attention, last layer, mean over heads",
}
