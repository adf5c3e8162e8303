"""Command line: `attn-explorer` opens the GUI; `export` and `cost` are subcommands.

Each subcommand lives in its own module that offers `add_arguments(parser)` and `run(args) -> int`,
imported only when that subcommand is used, so `export` never pays for Qt and the GUI never pays for
the cost lab. Bad input raises UserError: one line on stderr, exit status 2 (`--debug` shows the
traceback). Usage mistakes are UserErrors too: one line pointing at `--help`, not argparse's usage dump.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from attn_explorer.errors import UserError

# name -> (module, help). The module provides add_arguments(parser) and run(args).
SUBCOMMANDS = {
    "export": ("attn_explorer.cli.export", "run a model on text or an image and save its attention (.npz, .json, .png)"),
    "generate": ("attn_explorer.cli.generate", "let a decoder write after a prompt; save each new token's attention"),
    "cost": ("attn_explorer.cli.cost", "measure attention's time and memory against n for exact and efficient variants"),
    "train-vit": ("attn_explorer.cli.train_vit", "train the tiny ViT of the Lessons tab on digits (or MNIST, CIFAR-10)"),
    "ablate": ("attn_explorer.cli.ablate", "switch off each head in turn and save the L×H grid of its effect"),
    "patch": ("attn_explorer.cli.patch", "activation patching clean -> corrupt, per head or per (layer, position)"),
    "lens": ("attn_explorer.cli.lens", "a decoder's logit lens (top tokens per layer and position) and the direct "
             "logit attribution of a target token (.json)"),
    "corpus": ("attn_explorer.cli.corpus", "run many sentences (one a line) and save every head's statistics and "
               "chosen heads' query/key embeddings (.npz)"),
    # the head atlas (issue 27)
    "atlas": ("attn_explorer.cli.atlas", "stream a corpus (default: the bundled one) and save every head's metrics "
              "and top examples (.npz)"),
    "induction": ("attn_explorer.cli.induction", "every head's induction score by repeated random tokens (.npz)"),
    # the induction and retrieval lab (issue 27 B)
    "induction-check": ("attn_explorer.cli.lab_induction", "switch off the top induction heads and as many random "
                        "ones: the loss on repeated random tokens"),
    "retrieval": ("attn_explorer.cli.lab", "retrieval heads by needle in a haystack: accuracy by (length, depth), "
                  "every head's retrieval score (.npz)"),
}


class UsageError(UserError):
    """A mistake in the command line itself: an unknown option, a missing or malformed argument."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, except that a usage mistake raises UsageError instead of printing the usage and exiting.
    Subparsers are made with the same class, so subcommands behave alike."""

    def error(self, message: str):
        raise UsageError(message)


def _add_gui_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model to open: a built-in name, a folder, a .safetensors file or a hub id")
    p.add_argument("--text", help="text to show first")
    p.add_argument("--image", help="image file to show first")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, mps")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the weights' number format: float32 (default), bfloat16 or float16 (the CPU too)")
    p.add_argument("--view", default=None, help="page to show: grid, head, tokens, overlay, cost")
    p.add_argument("--session", metavar="FILE.axsession", help="open a saved session (File → Save session): "
                   "its model, input, selection, sliders, page and options, run again")
    p.add_argument("--open", metavar="RUN.npz", help="open a saved run (export --out run.npz, File → Export) "
                   "without its model: its maps, on the page it was saved from when known")
    p.add_argument("--screenshot", metavar="OUT.png", help="render the window, save it as PNG and exit")
    p.add_argument("--size", metavar="WxH", help="window size in pixels, for example 1024x700")
    p.add_argument("--lesson", metavar="NAME", help="open a lesson: by-hand, inside-a-head, projections, "
                   "multi-head, order, scaling, block, coreference, train-vit")
    p.add_argument("--self-test", action="store_true",
                   help="check this installation offscreen (models, stored values, every page) and exit")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the chosen subcommand's module is imported to add its arguments."""
    p = ArgumentParser(
        prog="attn-explorer",
        description="See what attention does inside transformers. With no subcommand, opens the window.",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    _add_gui_arguments(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
        sp.set_defaults(_module=module)
        if name == command:
            importlib.import_module(module).add_arguments(sp)
    return p


def _argv_command(argv: list[str]) -> str | None:
    return next((a for a in argv if a in SUBCOMMANDS), None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _argv_command(argv)
    try:
        args = build_parser(command).parse_args(argv)
    except UsageError as e:
        print(f"error: {e} (see attn-explorer{' ' + command if command else ''} --help)", file=sys.stderr)
        return 2
    from attn_explorer.resources import use_bundled_models

    use_bundled_models()
    from attn_explorer.core import heap

    heap.one_arena()  # before any thread allocates: a long forward's blocks then come from one heap (issue 24 A)
    try:
        if getattr(args, "self_test", False):
            from attn_explorer.cli.selftest import run as self_test

            return self_test()
        if args.command is None:
            from attn_explorer.gui.window.app import run_gui

            return run_gui(args)
        return int(importlib.import_module(args._module).run(args) or 0)
    except UserError as e:
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `attn-explorer cost ... | head`: the reader left; that is not an error
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
