import pytest
import tensorflow as tf

from components.contracts import schema


def test_encoded_example_is_a_tf_example():
    data = schema.encode_example(encoded=b"\xff\xd8bytes", image_format="jpeg", height=480, width=2**40,
                                 label=3, text="çat", source="s3://b/çat/1.jpg")
    example = tf.train.Example.FromString(data)
    feature = example.features.feature
    assert feature[schema.ENCODED].bytes_list.value == [b"\xff\xd8bytes"]
    assert feature[schema.WIDTH].int64_list.value == [2**40]
    assert feature[schema.LABEL].int64_list.value == [3]
    parsed = tf.io.parse_single_example(data, schema.feature_spec())
    assert parsed[schema.TEXT].numpy().decode() == "çat"
    assert parsed[schema.SOURCE].numpy().decode() == "s3://b/çat/1.jpg"
    assert int(parsed[schema.HEIGHT]) == 480 and parsed[schema.FORMAT].numpy() == b"jpeg"


def test_example_bytes_reads_back_what_encode_and_tensorflow_write():
    data = schema.encode_example(encoded=b"\xff\xd8\x00bytes", image_format="png", height=1, width=2**40,
                                 label=-1, text="çat", source="s3://b/çat/1.jpg")
    assert schema.example_bytes(data) == {schema.ENCODED: b"\xff\xd8\x00bytes", schema.FORMAT: b"png",
                                          schema.TEXT: "çat".encode(), schema.SOURCE: "s3://b/çat/1.jpg".encode()}
    example = tf.train.Example()  # TensorFlow's own serialization: map order, unpacked and float features
    example.features.feature[schema.SOURCE].bytes_list.value.extend([b"first", b"second"])
    example.features.feature[schema.HEIGHT].int64_list.value.append(7)
    example.features.feature["weight"].float_list.value.append(0.5)
    example.features.feature[schema.TEXT].bytes_list.value.append(b"")
    assert schema.example_bytes(example.SerializeToString()) == {schema.SOURCE: b"first", schema.TEXT: b""}


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\xff", b"\x0a\x80", b"\x0b", b"\x0a\x02\x0a\x09",
                                  b"\x0a\x04\x0a\x02\x0a\xff", b"\x09\x00\x00",
                                  b"\x0a\x0b\x0a\x09\x0a\x01\xff\x12\x04\x0a\x02\x0a\x00"])  # a key not UTF-8
def test_bytes_that_are_no_example_are_a_value_error(data):
    with pytest.raises(ValueError):
        schema.example_bytes(data)
