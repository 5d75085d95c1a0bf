import sys

from components.push.push import run

sys.exit(run())
