"""The report's "input-bound?" line names the cheapest fix the probe's figures show."""
from components.contracts.results import InputProbe
from components.report.input_verdict import verdict as _verdict
from tests.hints import assert_runnable

BOUND = {"input_images_per_sec": 150.0, "model_images_per_sec_synthetic": 900.0, "input_wait_seconds": 12.0,
         "input_bound": True, "compression": "gzip", "cache": None, "stored_short_side": 1500,
         "jpeg_share": 1.0, "decoded_gb": 40.0, "memory_gb": 24.0}


def verdict(image_size=224, **changes) -> str:
    return _verdict(InputProbe(**{**BOUND, **changes}), image_size)


def test_a_cache_comes_first_when_the_decoded_split_fits_in_memory():
    text = verdict(decoded_gb=2.0)
    assert ("Cheapest fix: train with the image cache in memory, `--set train.image_cache=memory` (by hand: "
            "`stoke train --image-cache memory`): the training split decoded is about 2.0 GB") in text
    assert_runnable(text)
    assert "image_cache" not in verdict(decoded_gb=2.0, cache="memory")


def test_one_new_ingest_for_spans_stored_larger_than_needed_and_gzip_on_jpeg():
    text = verdict()
    assert ("Cheapest fix: ingest the source again into a new ROOT with `--set ingest.max_side=512 --set "
            "ingest.compression=none` (by hand: `stoke ingest --max-side 512 --compression none`)") in text
    assert_runnable(text)
    assert "1500 px shorter side for 224 px training" in text and "GZIP saves under 1% on JPEG" in text
    assert "`--set ingest.max_side=768` (by hand: `stoke ingest --max-side 768`)" in verdict(image_size=384,
                                                                                              compression="none")
    assert "max_side" not in verdict(stored_short_side=384)
    assert "compression" not in verdict(jpeg_share=0.0)


def test_more_cpu_when_neither_a_cache_nor_an_ingest_helps():
    # 900 images/s for the model over 150 from this host's pipeline: six workers like this host.
    text = verdict(stored_short_side=384, compression="none")
    assert "Cheapest fix: more CPU: run the input pipeline on 6 tf.data service workers of this host's speed" in text
    assert ("`stoke data-service dispatcher --host HOST --trusted-network` on one machine, `stoke data-service worker "
            "--dispatcher HOST:5050 --host WORKER --trusted-network` on each of 6, then train with "
            "`--set train.data_service=grpc://HOST:5050` (by hand: `stoke train --data-service grpc://HOST:5050`); on "
            "a network that admits only them and the trainers") in text
    assert_runnable(text)
    assert "7 tf.data service workers" in verdict(stored_short_side=384, compression="none", input_images_per_sec=140.0)
    assert "tf.data service" not in verdict()  # a new ingest comes first


def test_no_fix_named_when_not_input_bound():
    assert verdict(input_bound=False).startswith("not input-bound")
    assert _verdict(InputProbe(**{**BOUND, "stored_short_side": None, "compression": None}))  # older metrics.json
