"""Training: published spans to a candidate SavedModel (`python -m components.train`)."""
import os

# tf.keras must mean Keras 2 in the training process, also for libraries that reach for it; this
# only works before TensorFlow is imported, which is why it is set when this package is. The code
# here imports tf_keras directly regardless.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
