import sys

from components.common.program import stage_arguments

stage_arguments("push")  # --help and usage errors answered before TensorFlow loads
from components.push.push import run  # noqa: E402

sys.exit(run())
