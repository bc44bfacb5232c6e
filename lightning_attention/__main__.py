import sys

from lightning_attention.cli import main

sys.exit(main())
