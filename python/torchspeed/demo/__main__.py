"""python -m torchspeed.demo: see torchspeed.demo."""

from . import main

raise SystemExit(main())
