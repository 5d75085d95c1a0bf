import sys

from components.train.trainer import run

sys.exit(run())
