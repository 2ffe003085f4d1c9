"""Repository-wide pytest set-up.

Under CI (``CI`` set) Hypothesis runs derandomized, so a landing is judged on the same examples
every time; local runs keep exploring new ones, and what they find is pinned with ``@example``.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
