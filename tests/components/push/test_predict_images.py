"""`stoke predict` refuses images from their headers, before Pillow or TensorFlow decodes a pixel."""
from __future__ import annotations

import json

import pytest
from PIL import Image, ImageFile

from components.push import predict
from tests.beam_jobs import images


@pytest.mark.parametrize("make, words", [
    (lambda: images.jpeg_declaring(60000, 60000), "too many pixels to decode safely"),
    (lambda: images.png_declaring(12000, 12000), "12000x12000 is 144 MP, more than the limit of 50 MP"),
    (lambda: images.gif_wider_than_its_screen(9000, 6000), "9000x6000 is 54 MP"),
    (lambda: images.icon(images.rgb_png()), "ICO files are not accepted"),
], ids=["jpeg-60000", "png-144mp", "gif-frame", "ico"])
def test_a_local_predict_refuses_from_the_header(tmp_path, capsys, monkeypatch, make, words):
    path = tmp_path / "picture.png"
    path.write_bytes(make())
    Image.init()

    def refuse(self, *args, **kwargs):
        raise AssertionError("decoded pixels before refusing")
    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)
    # The model folder is never reached: images are checked first.
    assert predict.run([str(tmp_path / "models" / "stoke"), str(path), "--json"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1
    error = json.loads(captured.out.strip().splitlines()[-1])["error"]
    assert str(path) in error and words in error
