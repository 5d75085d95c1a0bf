import sys

from components.datacheck.datacheck import run

sys.exit(run())
