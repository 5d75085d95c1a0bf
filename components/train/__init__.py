"""Training: published spans to a candidate SavedModel (`python -m components.train`).

trainer.py is the run, top to bottom; recipe.py is how it learns; data.py feeds it; models.py builds,
starts and exports the network; placement.py says on which devices; measure.py watches it;
data_service.py is the `stoke data-service` tool.
"""
import os

# tf.keras must mean Keras 2 in the training process, also for libraries that reach for it; this
# only works before TensorFlow is imported, which is why it is set when this package is. The code
# here imports tf_keras directly regardless.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


class TrainError(Exception):
    """A refusal with a message for the user (no traceback): every module of the stage raises it."""
