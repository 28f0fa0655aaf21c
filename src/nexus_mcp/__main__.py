"""``python -m nexus_mcp`` runs the ``nexus-mcp`` command."""

import sys

from nexus_mcp.cli import main

sys.exit(main())
