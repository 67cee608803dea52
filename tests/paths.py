"""The test data the suite carries: the official C++ client's captured frames (tests/data/captures)."""
from pathlib import Path

CAPTURES = Path(__file__).resolve().parent / "data" / "captures"
