import sys

from components.common.program import stage_arguments

stage_arguments("train")  # --help and usage errors answered before TensorFlow loads
from components.train.trainer import run  # noqa: E402

sys.exit(run())
