"""The command line: `attn-explorer` (the window) and its subcommands, one module each."""
