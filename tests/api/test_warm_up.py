"""The first forward pass of a model carries one-off start-up costs: it is marked, never passed off as
the cost of attention (the status bar said 251 ms for the first run against 11 ms for the next)."""
from __future__ import annotations

import attn_explorer as ax


def test_only_the_first_run_of_a_model_is_marked_warm_up():
    m = ax.load_model("textbook")
    first, second, third = (m.run("the animal was tired") for _ in range(3))
    assert first.warm_up and not second.warm_up and not third.warm_up
    again = ax.load_model("textbook")  # a new model object warms up again
    assert again.run("the animal was tired").warm_up
