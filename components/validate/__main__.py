import sys

from components.validate.gate import run

sys.exit(run())
