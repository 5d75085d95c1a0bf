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
