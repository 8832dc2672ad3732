import sys
from pathlib import Path

# Test helpers (reference loops, strategies, case loaders) live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))
