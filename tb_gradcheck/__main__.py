"""``python -m tb_gradcheck``: the ``tb-gradcheck`` command (``cli``), for an environment whose scripts are not on PATH."""

import sys

from tb_gradcheck.cli import main

sys.exit(main())
