import sys

from components.common.program import stage_arguments

stage_arguments("gate")  # --help and usage errors answered before TensorFlow and TFMA load
from components.gate.gate import run  # noqa: E402

sys.exit(run())
