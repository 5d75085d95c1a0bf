"""The gate (`python -m components.gate`, `stoke gate`): TFMA against thresholds and the
served model, a serving check in a fresh process, and BLESSED or NOT_BLESSED with reasons."""
