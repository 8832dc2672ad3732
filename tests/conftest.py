import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Test helpers (reference loops, strategies, case loaders) live beside the tests; the
# examples package is imported from the repository root.
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))
