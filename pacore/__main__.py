"""``python -m pacore``: the same command line as the ``pacore`` script."""
import sys

from .cli import main

sys.exit(main())
