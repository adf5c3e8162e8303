"""Our MiniLM forward (with every attention map) against transformers' BertModel, eager, output_attentions=True.

Same weights, same process, interleaved, 2 threads. Prints a markdown table of medians and the same-run
ratio at n = 16 ... 512: our forward on the product core.linear takes on this machine (`path_choice`
"auto": MKL's packed product on Intel, oneDNN's elsewhere), then on each other path (oneDNN's packed
product, MKL's, plain F.linear) to show what each is worth here; then the cold start of
`python main.py export` (whole process, median of 5 runs).

    python benchmarks/bench_forward.py [--repeats 30] [--no-cold] [--out docs/bench_forward.md]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = (16, 32, 64, 128, 256, 512)


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def forward_table(repeats: int) -> str:
    import attn_explorer as ax
    from attn_explorer.core import linear
    from attn_explorer.hub.load import minilm_folder
    from transformers import BertModel

    torch.set_num_threads(2)
    ours = ax.load_model("minilm", device="cpu")
    hf = BertModel.from_pretrained(str(minilm_folder()), attn_implementation="eager").eval()
    auto = linear._path(torch.float32)
    others = [p for p in ("packed", "mkl", "plain") if p != auto and (p != "mkl" or linear._MKL)]
    names = {"packed": "oneDNN packed", "mkl": "MKL packed", "plain": "F.linear"}
    rows = [f"| n | ours ({names[auto]}) ms | HF eager ms | **ours / HF** | "
            + " | ".join(f"on {names[p]} ms | ÷ HF" for p in others) + " | max abs diff |",
            "|---:|---:|---:|---:|" + "---:|---:|" * len(others) + "---:|"]
    copies = {p: ax.load_model("minilm", device="cpu") for p in others}
    for n in SIZES:
        ids = torch.randint(1000, 20000, (1, n))

        def on(path):
            def run():  # its own copy of the model: a packed weight is packed for one path (a switch repacks)
                linear.path_choice = path
                try:
                    return copies[path].module(input_ids=ids, output_attentions=True)
                finally:
                    linear.path_choice = "auto"
            return run

        with torch.inference_mode():
            runs = [lambda: ours.module(input_ids=ids, output_attentions=True),  # noqa: E731
                    lambda: hf(input_ids=ids, output_attentions=True)] + [on(p) for p in others]  # noqa: E731
            for _ in range(3):
                for run in runs:
                    run()
            times: list[list[float]] = [[] for _ in runs]
            for _ in range(repeats):  # interleaved, so drift hits all alike
                for run, t in zip(runs, times):
                    t.append(_ms(run))
            diff = max((x - y).abs().max().item() for x, y in zip(runs[0]().attentions.unbind(1), runs[1]().attentions))
        med = [statistics.median(t) for t in times]
        rows.append(f"| {n} | {med[0]:.2f} | {med[1]:.2f} | **{med[0] / med[1]:.2f}** | "
                    + " | ".join(f"{m:.2f} | {m / med[1]:.2f}" for m in med[2:]) + f" | {diff:.1e} |")
    return "\n".join(rows)


def cold_start_table(runs: int = 5) -> str:
    text = "The animal didn't cross the street because it was too tired"
    times = {"ours: main.py export --model minilm": [], "HF: import transformers.BertModel + load + forward": []}
    hf_code = ("import torch, sys; from transformers import BertModel, AutoTokenizer; "
               f"f=sys.argv[1]; t=AutoTokenizer.from_pretrained(f); m=BertModel.from_pretrained(f, attn_implementation='eager'); "
               f"m(**t({text!r}, return_tensors='pt'), output_attentions=True)")
    from attn_explorer.hub.load import minilm_folder

    with tempfile.TemporaryDirectory() as d:
        for _ in range(runs):
            for name, cmd in (
                ("ours: main.py export --model minilm",
                 [sys.executable, str(ROOT / "main.py"), "export", "--model", "minilm", "--text", text, "--out", f"{d}/x.npz"]),
                ("HF: import transformers.BertModel + load + forward", [sys.executable, "-c", hf_code, str(minilm_folder())]),
            ):
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                times[name].append(time.perf_counter() - t0)
    rows = ["| cold start (whole process) | median s | min s |", "|---|---:|---:|"]
    for name, t in times.items():
        rows.append(f"| {name} | {statistics.median(t):.2f} | {min(t):.2f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-start table (10 whole processes)")
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = ap.parse_args()
    text = "## Forward pass, MiniLM (6 layers x 12 heads), all attentions, 2 threads\n\n" + forward_table(args.repeats)
    if not args.no_cold:
        text += "\n\n## Cold start to a written .npz\n\n" + cold_start_table()
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
