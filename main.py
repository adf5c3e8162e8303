"""Start attn-explorer: `python main.py` opens the window; subcommands run the CLI."""
import sys

from attn_explorer.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
