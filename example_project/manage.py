#!/usr/bin/env python
"""Django's command-line utility for the example site (run from the repository root)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    # The site's modules are imported as ``example_project.*``.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.django_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
