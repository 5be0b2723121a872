"""`python -m torchspeed ...` runs the torchspeed command line (the same as `torchspeed ...`)."""

from .cli import main

raise SystemExit(main())
