"""Suite-wide settings: the engine core checks its KV blocks and queues after every step
(the debug switch), in this process and in every server it starts."""

from __future__ import annotations

import os

from stepserve.core.base import CHECK_INTEGRITY_ENV

os.environ[CHECK_INTEGRITY_ENV] = "1"
