"""An atlas example's snippet reads as the text did: pieces of one word join, words keep their spaces."""
import re

from attn_explorer.gui.analysis.atlas_examples import snippet_html


def plain(tokens, q=0, k=0):
    return re.sub(r"<[^>]+>", "", snippet_html(tokens, q, k))


def test_byte_level_pieces_of_a_word_join():  # SmolLM2 showed 'TH ES E US' for THESEUS
    assert plain(["Enter", " TH", "ES", "E", "US", ",", " H", "IP", "POL", "YTA"]) == "Enter THESEUS, HIPPOLYTA"


def test_sentencepiece_word_starts_are_spaces():
    assert plain(["▁The", "▁cat", "▁sat", "s", "."]) == " The cat sats."


def test_wordpieces_join_and_plain_tokens_are_words():
    assert plain(["the", "play", "##ing", "cat"]) == "the playing cat"


def test_query_and_key_stay_marked():
    out = snippet_html([" a", "b", " c"], 1, 2)
    assert out.count("<span") == 2 and "b</span>" in out and " c</span>" in out
