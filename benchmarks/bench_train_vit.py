"""Training speed of the tiny ViT built from our `core` modules against the same shapes built from
`torch.nn.TransformerEncoderLayer` (pre-LN `norm_first=True`, `batch_first=True`), and the time
`train-vit --data digits` takes to reach 90 % held-out accuracy.

    python benchmarks/bench_train_vit.py [--rounds 7] [--threads 1] [--quick] [--out docs/bench_train_vit.md]

Both models get the same weights (ours copied into torch's, checked by an equal loss on one batch), the
same data (the 8×8 digits' training split), the same batch order, AdamW and cross-entropy, in the same
process. One round is one epoch of each, interleaved batch by batch (alternating which goes first), so
a busy machine slows both alike; the table gives the median and min–max of images per second over the
rounds (step time only) and the ratio of our time to torch's (the target is at most 1.25). --threads sets torch's thread count for both (the lesson trains on one thread).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attn_explorer.lessons import train_vit as T  # noqa: E402
from attn_explorer.lessons.digits import load_digits  # noqa: E402


class TorchViT(nn.Module):
    """The tiny ViT's shapes from torch's own layers: conv patches, [CLS], positions, nn.TransformerEncoder."""

    def __init__(self, cfg):
        super().__init__()
        D = cfg.dim
        self.patch = nn.Conv2d(cfg.channels, D, cfg.patch_size, cfg.patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, D))
        self.pos = nn.Parameter(torch.zeros(1, (cfg.image_size // cfg.patch_size) ** 2 + 1, D))
        layer = nn.TransformerEncoderLayer(D, cfg.num_heads, cfg.mlp_hidden, dropout=0.0, activation="gelu",
                                           layer_norm_eps=cfg.eps, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D, eps=cfg.eps)
        self.head = nn.Linear(D, cfg.num_labels)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch(pixels).flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])

    @torch.no_grad()
    def copy_from(self, ours) -> "TorchViT":
        self.patch.load_state_dict(ours.patch_embed.proj.state_dict())
        self.cls.copy_(ours.cls_token)
        self.pos.copy_(ours.pos_embed)
        for mine, block in zip(self.encoder.layers, ours.blocks.layers):
            a = block.attn
            mine.self_attn.in_proj_weight.copy_(torch.cat([a.query.weight, a.key.weight, a.value.weight]))
            mine.self_attn.in_proj_bias.copy_(torch.cat([a.query.bias, a.key.bias, a.value.bias]))
            mine.self_attn.out_proj.load_state_dict(a.out.state_dict())
            mine.linear1.load_state_dict(block.mlp.fc1.state_dict())
            mine.linear2.load_state_dict(block.mlp.fc2.state_dict())
            mine.norm1.load_state_dict(block.norm1.state_dict())
            mine.norm2.load_state_dict(block.norm2.state_dict())
        self.norm.load_state_dict(ours.norm.state_dict())
        self.head.load_state_dict(ours.heads[0].state_dict())
        return self


def interleaved_epoch(runs: dict, x, y, batch: int, seed: int) -> dict[str, float]:
    """One epoch of AdamW steps for every model, interleaved batch by batch (the order alternating), so
    that a busy neighbour slows both alike. Returns each model's summed step time in seconds."""
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    spent = dict.fromkeys(runs, 0.0)
    names = list(runs)
    for i, b in enumerate(range(0, len(y), batch)):
        idx = order[b:b + batch]
        for name in (names if i % 2 == 0 else names[::-1]):
            model, logits_of, opt = runs[name]
            t0 = time.perf_counter()
            loss = F.cross_entropy(logits_of(model, x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            spent[name] += time.perf_counter() - t0
    return spent


def speed_table(rounds: int, batch: int) -> tuple[list[str], float]:
    d = load_digits(seed=0)
    x, y = T.normalise(torch.from_numpy(d.x_train)), torch.from_numpy(d.y_train)
    cfg = T.model_config(8)
    ours = T.new_model(cfg, seed=0)
    ref = TorchViT(cfg).copy_from(ours)
    with torch.no_grad():
        a = F.cross_entropy(ours(x[:64]).logits, y[:64])
        b = F.cross_entropy(ref(x[:64]), y[:64])
    assert torch.allclose(a, b, atol=1e-5), (float(a), float(b))  # the same model, two builds
    ours.train()
    ref.train()
    runs = {"ours": (ours, lambda m, xb: m(xb).logits, torch.optim.AdamW(ours.parameters(), lr=1e-3)),
            "torch": (ref, lambda m, xb: m(xb), torch.optim.AdamW(ref.parameters(), lr=1e-3))}
    interleaved_epoch(runs, x, y, batch, seed=99)  # warm-up
    times: dict[str, list[float]] = {"ours": [], "torch": []}
    for r in range(rounds):
        for name, spent in interleaved_epoch(runs, x, y, batch, seed=r).items():
            times[name].append(spent)
    n = len(y)
    ratios = [o / t for o, t in zip(times["ours"], times["torch"])]
    rows = [f"Equal loss on one batch before timing: ours {float(a):.6f}, torch {float(b):.6f}.", "",
            f"{n} images per epoch, batch {batch}, {rounds} rounds, {torch.get_num_threads()} thread(s).", "",
            "| model | images/s median | min–max | epoch s median |", "|---|---:|---:|---:|"]
    for name in ("ours", "torch"):
        ts = times[name]
        rows.append(f"| {'core VisionTransformer' if name == 'ours' else 'nn.TransformerEncoderLayer'} | "
                    f"{n / statistics.median(ts):,.0f} | {n / max(ts):,.0f}–{n / min(ts):,.0f} | "
                    f"{statistics.median(ts):.3f} |")
    ratio = statistics.median(ratios)
    rows += ["", f"Ours / torch time, median of the per-round ratios: **{ratio:.2f}** "
                 f"(min–max {min(ratios):.2f}–{max(ratios):.2f}; target ≤ 1.25)."]
    return rows, ratio


def threads_table(rounds: int, batch: int) -> list[str]:
    """Our model on one thread against all of them, interleaved step by step: why the lesson trains on one."""
    many = os.cpu_count() or 1
    if many == 1:
        return ["One core only: nothing to compare."]
    d = load_digits(seed=0)
    x, y = T.normalise(torch.from_numpy(d.x_train)), torch.from_numpy(d.y_train)
    model = T.new_model(T.model_config(8), seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    spent = {1: [], many: []}
    saved = torch.get_num_threads()
    try:
        for r in range(rounds + 1):
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(r))
            for i, b in enumerate(range(0, len(y), batch)):
                idx = order[b:b + batch]
                for n in ((1, many) if i % 2 == 0 else (many, 1)):
                    torch.set_num_threads(n)
                    t0 = time.perf_counter()
                    loss = F.cross_entropy(model(x[idx]).logits, y[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    if r:  # round 0 warms up
                        spent[n].append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(saved)
    one, all_ = statistics.median(spent[1]) * 1e3, statistics.median(spent[many]) * 1e3
    return [f"Our model, one training step (batch {batch}), median over {len(spent[1])} steps each, interleaved:", "",
            "| threads | ms per step |", "|---:|---:|", f"| 1 | {one:.1f} |", f"| {many} | {all_:.1f} |", "",
            f"{many} threads / 1 thread: **{all_ / one:.2f}**. At these sizes (17 tokens of 64 numbers) splitting "
            "each product costs more than it saves, and far more when other processes want the cores, so the "
            "lesson's trainer runs its steps on one thread (`lessons.train_vit.one_thread`)."]


def time_to_90(epochs: int) -> list[str]:
    """`train-vit --data digits` (its defaults) timed to the first epoch whose held-out accuracy is ≥ 90 %."""
    t = T.Trainer(T.TrainSettings(data="digits", epochs=epochs, seed=0))
    reached = None
    for r in t.run():
        if r.epoch_end and r.test_acc >= 0.9 and reached is None:
            reached = r
    lines = [f"`python main.py train-vit --data digits --epochs {epochs} --seed 0` (in-process, one thread for "
             f"training as the lesson does): final held-out accuracy {100 * t.test_acc:.1f} % after "
             f"{r.elapsed_s:.1f} s."]
    if reached is None:
        lines.append("It never reached 90 % held-out accuracy.")
    else:
        lines.append(f"First reached 90 % held-out accuracy at epoch {round(reached.epoch)} (step {reached.step}), "
                     f"**{reached.elapsed_s:.1f} s** after the start ({100 * reached.test_acc:.1f} %).")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=40, help="epochs of the time-to-90 %% run (default 40)")
    ap.add_argument("--quick", action="store_true", help="3 rounds, 15 epochs: check that it runs")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_train_vit.md"))
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.epochs = 3, 15
    torch.set_num_threads(a.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    speed, ratio = speed_table(a.rounds, a.batch)
    parts = ["# Training the tiny ViT: our modules against torch's", "",
             f"Written by `python benchmarks/bench_train_vit.py{' --quick' if a.quick else ''}` on "
             f"{datetime.datetime.now():%Y-%m-%d %H:%M}; {platform.machine()}, {os.cpu_count()} cores, torch "
             f"{torch.__version__}; 1-minute load average at the start {load:.2f}.", "",
             "## Images per second, same weights, same batches, interleaved", "", *speed, "",
             "## One thread or all of them", "", *threads_table(a.rounds, a.batch), "",
             "## Time to 90 % held-out accuracy", "", *time_to_90(a.epochs), ""]
    Path(a.out).write_text("\n".join(parts) + "\n", encoding="utf-8")
    print("\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
