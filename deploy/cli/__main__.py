"""`python -m funke.deploy.cli ...`: the `funke` command."""

import sys

from funke.deploy.cli import main

sys.exit(main())
