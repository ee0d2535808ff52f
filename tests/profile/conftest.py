"""The target-profile tests reach our own server through tests/server's harness, and a
server without /metrics through stub_server.py here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
sys.path.insert(0, str(Path(__file__).parent))
