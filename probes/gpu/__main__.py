"""Lets ``python -m doctor.probes.gpu`` keep working now that the probe is a package."""

from .cli import main

raise SystemExit(main())
