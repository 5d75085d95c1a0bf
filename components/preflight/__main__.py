import sys

from components.common.program import stage_arguments

stage_arguments("preflight")  # --help and usage errors answered before TensorFlow loads
from components.preflight.preflight import run  # noqa: E402

sys.exit(run())
