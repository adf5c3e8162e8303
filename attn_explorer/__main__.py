import sys

from attn_explorer.cli import main

sys.exit(main())
