"""`python -m stabexp`: what torchrun starts (`torchrun --nproc-per-node=K -m stabexp run ...`)."""

import sys

from stabexp.cli import main

sys.exit(main())
