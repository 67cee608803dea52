"""Where the shared protocol captures are: `shared/` beside the checkout (CI clones main with
shared/ next to it), else the workplace's /work/shared."""
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
CAPTURES = next((p for p in (_REPO.parent / "shared" / "protocol" / "captures",
                             Path("/work/shared/protocol/captures")) if p.is_dir()),
                _REPO.parent / "shared" / "protocol" / "captures")
