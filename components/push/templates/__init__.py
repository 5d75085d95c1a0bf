"""The serving image's templates, read as package data by components/push/serving_image.py."""
