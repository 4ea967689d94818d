import sys
from pathlib import Path

# The tests' own helpers (server.py) import as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))
