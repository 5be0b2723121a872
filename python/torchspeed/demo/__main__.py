"""python -m torchspeed.demo: see torchspeed.demo."""

from . import main
from .flags import check_path_flags

check_path_flags(None)
raise SystemExit(main())
