"""Shared by every area's tests: keep Prefect and Sailor off the user's home directory.

Prefect reads its settings when first imported, so this runs before any test
module imports it.  Areas that need a Prefect server use their own fixtures
(tests/flows/conftest.py starts one real server per session).
"""

import os
import tempfile

# Forced, not defaulted: a test run must never read or write the user's jobs, profiles or Prefect DB.
_home = tempfile.mkdtemp(prefix="sailor-test-home-")
os.environ["SAILOR_HOME"] = _home
os.environ["PREFECT_HOME"] = os.path.join(_home, "prefect")
os.environ.pop("SAILOR_JOBS_URL", None)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
