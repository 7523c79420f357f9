"""The ``slotgate`` command line (``router.cli.app:app``): it depends on the library packages
(tuning, monitoring, http), never the other way round."""
