"""``python -m ftconsole.lab serve|up|down|status`` (what `lab_up` starts in the background)."""

import sys

from ftconsole.lab.command import main

sys.exit(main())
