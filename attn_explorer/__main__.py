import sys

from attn_explorer.cli.main import main

sys.exit(main())
