"""Shared pieces: MiniLM loaded once, and a few sentences to measure heads on."""
from __future__ import annotations

import pytest

SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "A quick brown fox jumps over the lazy dog.",
    "She said that the results were surprising, but nobody believed her.",
    "Transformers read every word of a sentence at once.",
    "My grandmother grows tomatoes, beans and far too many courgettes.",
    "The meeting was moved to Thursday afternoon after lunch.",
    "If it rains tomorrow, we will stay inside and play cards.",
    "Researchers measured how attention changes across the layers of the network.",
    "He parked the car, locked the door and walked to the station.",
    "Music from the open window filled the quiet street.",
]


@pytest.fixture(scope="session")
def minilm():
    import attn_explorer as ax

    return ax.load_model("minilm", device="cpu")
