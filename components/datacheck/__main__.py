import sys

from components.common.program import stage_arguments

stage_arguments("datacheck")  # --help and usage errors answered before TensorFlow Metadata loads
from components.datacheck.datacheck import run  # noqa: E402

sys.exit(run())
