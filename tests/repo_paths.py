"""Where the repository's parts are, for tests in any folder under tests/ (they are grouped by layer, so a path
relative to a test file would depend on how deep it sits)."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the repository root (tests/ is directly under it)
FIXTURES = REPO / "tests" / "fixtures"  # golden files, each made by the tools/ script its test names

REPO_DIR = str(REPO)  # the same, as text (environment variables, os.path.join)
