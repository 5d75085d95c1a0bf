import sys

from components.gate.gate import run

sys.exit(run())
