"""Suite-wide settings. Under CI (CI=true) property-based tests run derandomized, so a CI result
depends on the commit alone; local runs keep exploring new random examples."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
