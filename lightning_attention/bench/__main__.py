import sys

from lightning_attention.bench.cli import main

sys.exit(main())
