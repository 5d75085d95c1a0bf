"""The hand-off (`python -m components.push`, `stoke push`): blessed candidates into the TF Serving
model repository and the serving image build context; rollback, lineage and predict beside it."""
