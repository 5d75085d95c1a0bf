import sys

from components.preflight.doctor import run

sys.exit(run())
