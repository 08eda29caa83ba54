"""Suite-wide test settings.

Property tests (hypothesis) are derandomized when the ``CI`` environment variable is set (as
``.ci/run`` and CI services do): the same code always meets the same examples there, so a red
CI run means a code change. Locally each run draws new examples and replays failures saved in
``.hypothesis/``.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("local")
settings.load_profile("ci" if os.environ.get("CI", "").lower() not in ("", "0", "false") else "local")
