"""What a span holds, by content: exact copies never cross splits, blank frames are set aside, and
the statistics (statistics/Split-*/FeatureStats.pb) describe the shards. Real image files through
the real Beam job."""
import gzip
import hashlib
import io
import json
import os
import shutil

from PIL import Image
from tensorflow_metadata.proto.v0 import statistics_pb2

from components.common.files import read_json
from components.common.spans import Spans
from components.contracts import schema
from components.contracts.layout import MANIFEST, Root
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest, records


def photos(folder, count, label="cat", start=0):
    """`count` different pictures (each its own pattern, not only its own noise), as JPEG and PNG."""
    (folder / label).mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        pixels = images.pixels(48, 64, seed=i)
        pixels = pixels[:, ::-1] if i % 2 else pixels  # mirrored: another picture, not a near-duplicate
        pixels = (pixels.astype(int) + i * 37) % 256
        picture = Image.fromarray(pixels.astype("uint8"))
        fmt = "PNG" if i % 3 == 0 else "JPEG"
        (folder / label / f"{i}.{fmt.lower().replace('jpeg', 'jpg')}").write_bytes(images.encode(picture, fmt))


def contents_by_split(root):
    """The decoded pictures of every published span, by split."""
    found = {"train": set(), "eval": set()}
    for manifest in Spans(str(root)).manifests(checked=False):
        for record in records(root, manifest.model_dump()):
            found[record["split"]].add(hashlib.sha256(record["pixels"].tobytes()).hexdigest())
    return found


def manifest_of(summary):
    return read_json(os.path.join(summary["span_uri"], MANIFEST))


def test_a_reupload_under_new_names_publishes_nothing_and_no_content_crosses_splits(tmp_path, capsys):
    first, root = tmp_path / "first", tmp_path / "root"
    photos(first, 12, "cat")
    photos(first, 12, "dog", start=12)
    code, summary = ingest(first, root, "--eval-fraction", "0.5", *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["published"] and summary["counts"]["duplicates"] == 0

    again = tmp_path / "uploads" / "2026-12-02"  # another folder, other names; a PNG now named .jpg
    for path in sorted(first.rglob("*.*")):
        target = again / path.parent.name / f"copy of {path.stem}.jpg"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    code, summary = ingest(again, root, "--eval-fraction", "0.5", *IN_MEMORY, capsys=capsys)
    assert code == 0 and not summary["published"] and summary["duplicates"] == 24
    assert "nothing new" in summary["message"] and "24 new files" in summary["message"]
    assert summary["dead_letters"][0]["reason"].startswith(f"duplicate of {first}")

    listed = tmp_path / "listed"  # the same copies again, named by a CSV manifest this time
    (listed / "img").mkdir(parents=True)
    rows = ["uri,label"]
    for n, path in enumerate(sorted(first.rglob("*.*"))):
        shutil.copyfile(path, listed / "img" / f"{n}.jpeg")
        rows.append(f"img/{n}.jpeg,{path.parent.name}")
    (listed / "manifest.csv").write_text("\n".join(rows) + "\n")
    code, summary = ingest(listed / "manifest.csv", root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and not summary["published"] and summary["duplicates"] == 24

    split = contents_by_split(root)
    assert len(split["train"]) + len(split["eval"]) == 24 and not split["train"] & split["eval"]
    assert Spans(str(root)).span_numbers() == [1]


def test_the_same_picture_under_two_labels_is_kept_out_and_recorded(tmp_path, capsys):
    first, second, root = tmp_path / "first", tmp_path / "second", tmp_path / "root"
    photos(first, 3, "cat")
    assert ingest(first, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1
    photos(second, 2, "dog", start=10)
    shutil.copyfile(first / "cat" / "1.jpg", second / "dog" / "mislabelled.jpg")
    code, summary = ingest(second, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["span"] == 2 and summary["counts"]["duplicates"] == 1
    [copy] = [d for d in dead_letters(root, 2) if d["uri"].endswith("mislabelled.jpg")]
    split = read_json(str(root / "data" / "spans" / "span-00001" / MANIFEST))  # where cat/1.jpg went
    assert copy["reason"].startswith(f"duplicate of {first / 'cat' / '1.jpg'} (span 1, split ")
    assert copy["reason"].endswith(") labelled cat") and split["counts"]["duplicates"] == 0
    [anomaly] = manifest_of(summary)["anomalies"]
    assert anomaly["kind"] == "label_conflict" and anomaly["count"] == 1 and summary["anomalies"] == [anomaly]
    assert anomaly["examples"] == [{"uri": str(second / "dog" / "mislabelled.jpg"), "label": "dog",
                                    "duplicate_of": str(first / "cat" / "1.jpg"), "other_label": "cat",
                                    "other_span": 1}]
    for found in statistics(root, 2).values():  # on each split that has records
        for label in (f for f in found.datasets[0].features if f.path.step == [schema.TEXT]):
            assert [(c.name, c.num) for c in label.custom_stats] == [("label_conflicts", 1)]
    assert any(f.datasets[0].features for f in statistics(root, 2).values())


def test_copies_within_one_arrival_are_published_once(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    photos(source, 4, "cat")
    photos(source, 1, "dog", start=20)
    for name in ("b-copy.jpg", "z-copy.jpg"):
        shutil.copyfile(source / "cat" / "1.jpg", source / "cat" / name)
    shutil.copyfile(source / "cat" / "1.jpg", source / "dog" / "a-copy.jpg")  # another label too
    code, summary = ingest(source, root, "--eval-fraction", "0.5", *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["duplicates"] == 3
    assert summary["counts"]["train"] + summary["counts"]["eval"] == 5
    kept = str(source / "cat" / "1.jpg")  # the smallest URI of the four
    found = records(root, manifest_of(summary))
    assert [r[schema.SOURCE] for r in found].count(kept) == 1
    assert not any("copy" in r[schema.SOURCE] for r in found)
    reasons = {os.path.basename(d["uri"]): d["reason"] for d in dead_letters(root, 1)}
    split = next(r["split"] for r in found if r[schema.SOURCE] == kept)
    assert reasons["b-copy.jpg"] == reasons["z-copy.jpg"] == f"duplicate of {kept} (this span, split {split})"
    assert reasons["a-copy.jpg"] == f"duplicate of {kept} (this span, split {split}) labelled cat"
    assert manifest_of(summary)["anomalies"][0]["count"] == 1


def blank_jpeg(level: int) -> bytes:
    return images.encode(Image.new("RGB", (64, 48), (level, level, level)), "JPEG", quality=90)


def test_blank_frames_are_set_aside_and_the_good_images_beside_them_are_published(tmp_path, capsys):
    """A dead camera's 30 blank frames beside 10 good photos, at the default ingest.max_bad_fraction
    (0.05): the blanks are set aside with their reason and named by folder, the photos are published."""
    source, root = tmp_path / "source", tmp_path / "root"
    photos(source, 10, "cat")
    (source / "cat" / "dead-camera").mkdir()
    for i in range(30):
        (source / "cat" / "dead-camera" / f"frame-{i:02d}.jpg").write_bytes(blank_jpeg(i * 8))
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["dead_letter"] == 30 and summary["counts"]["duplicates"] == 0
    assert all(d["reason"].startswith("blank image: std 0.0") for d in dead_letters(root, 1))
    assert {r[schema.TEXT] for r in records(root, manifest_of(summary))} == {"cat"}
    assert summary["set_aside"] == {str(source / "cat" / "dead-camera"): 30}

    code, summary = ingest(source, tmp_path / "other", "--blank-std", "0", *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["dead_letter"] == 0  # 0 keeps them


def test_blanks_with_copies_are_judged_over_the_files_that_are_not_copies(tmp_path, capsys):
    """30 blank frames arriving with 180 re-uploads of published photos and 2 broken files: 2 of the 32
    files that are not copies are bad (6%, above 0.05): the arrival fails naming the broken ones, and
    the denominator leaves the copies out."""
    source, root = tmp_path / "source", tmp_path / "root"
    photos(source, 20, "cat")
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[0] == 0
    published = sorted((source / "cat").iterdir())
    for i in range(180):
        original = published[i % len(published)]
        shutil.copyfile(original, source / "cat" / f"again-{i:03d}{original.suffix}")
    (source / "cam").mkdir()
    for i in range(30):
        (source / "cam" / f"frame-{i:02d}.jpg").write_bytes(blank_jpeg(i * 8))
    code, summary = ingest(source, root, "--max-bad-fraction", "0.1", *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["published"] is False and summary["duplicates"] == 180
    assert "all 210 new files were set aside" in summary["message"] and summary["set_aside"] == {str(source / "cam"): 30}
    for i in range(2):
        (source / "cat" / f"broken-{i}.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 1 and "2 of 32 new sources (6.2%, copies aside) are unreadable or broken" in summary["error"]
    assert "broken-0.jpg" in summary["error"] and "frame-" not in summary["error"]


def statistics(root, span) -> dict:
    """Split -> the span's statistics of it, as TFX's StatisticsGen lays them out."""
    found = {}
    for split in schema.SPLITS:
        with open(Root(str(root)).statistics(span, split), "rb") as f:
            found[split] = statistics_pb2.DatasetFeatureStatisticsList.FromString(f.read())
    return found


def test_statistics_describe_each_split_of_the_shards(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    photos(source, 9, "cat")
    photos(source, 6, "dog", start=9)
    code, summary = ingest(source, root, "--eval-fraction", "0.4", *IN_MEMORY, capsys=capsys)
    manifest = manifest_of(summary)
    assert sorted(os.listdir(os.path.join(summary["span_uri"], "statistics"))) == ["Split-eval", "Split-train"]
    assert not os.path.exists(os.path.join(summary["span_uri"], "statistics.pb"))
    for split, found in statistics(root, 1).items():
        [dataset] = found.datasets
        shards = sum(s["records"] for s in manifest["shards"] if s["split"] == split)
        assert dataset.num_examples == shards == manifest["counts"][split] > 0
        features = {"/".join(f.path.step): f for f in dataset.features}
        assert sorted(features) == sorted(schema.feature_spec())  # the records' features, and only those
        labels = features[schema.TEXT].string_stats.rank_histogram.buckets
        assert sum(b.sample_count for b in labels) == shards and {b.label for b in labels} <= {"cat", "dog"}
        width = features[schema.WIDTH].num_stats
        assert width.min == width.max == 64 and [b.sample_count for b in width.histograms[0].buckets] == [shards]
        image = features[schema.ENCODED]
        assert image.type == image.BYTES and image.bytes_stats.common_stats.num_non_missing == shards
        measures = {c.name: c for c in image.custom_stats}
        assert "domain_info" not in measures and measures["pixel_std.min"].num > 2.0
        assert measures["aspect_ratio.min"].num == measures["aspect_ratio.max"].num == 64 / 48
        assert measures["encoded_bytes.max"].num == image.bytes_stats.max_num_bytes
        assert sum(b.sample_count for b in measures["pixel_mean.histogram"].histogram.buckets) == shards


def test_near_copies_in_the_splits_a_manifest_gives_stay_there_and_are_reported(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    (source / "img").mkdir(parents=True)
    original = images.photo_jpeg(320, 240)
    smaller = Image.open(io.BytesIO(original)).resize((160, 120))
    (source / "img" / "a.jpg").write_bytes(original)
    (source / "img" / "b.jpg").write_bytes(images.encode(smaller, "JPEG", quality=60))
    (source / "img" / "c.png").write_bytes(images.encode(Image.open(io.BytesIO(original)), "PNG"))
    photos(source / "img", 3, "other")
    rows = ["uri,label,split", "img/a.jpg,cat,train", "img/b.jpg,cat,eval", "img/c.png,cat,train"]
    rows += [f"img/other/{p.name},dog,eval" for p in sorted((source / "img" / "other").iterdir())]
    (source / "manifest.csv").write_text("\n".join(rows) + "\n")
    code, summary = ingest(source / "manifest.csv", root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"] == {"train": 2, "eval": 4, "dead_letter": 0, "duplicates": 0}
    near = summary["near_duplicates"]
    assert near["count"] == 2 and near["moved"] == 0 and near["across"] == 1  # b (eval) looks like a; c like a
    pair = next(p for p in near["examples"] if p["uri"].endswith("b.jpg"))
    assert pair["split"] == "eval" and pair["other_split"] == "train" and pair["distance"] <= 4
    assert json.dumps(near)  # plain JSON in the summary


def reverse_lines(path) -> None:
    with gzip.open(path, "rt") as f:
        lines = f.readlines()
    with gzip.open(path, "wt") as f:
        f.writelines(lines[::-1])


def test_exact_copies_never_cross_splits_through_an_unsorted_content_index(tmp_path, capsys):
    first, again, root = tmp_path / "first", tmp_path / "again", tmp_path / "root"
    photos(first, 12, "cat")
    photos(first, 12, "dog", start=12)
    assert ingest(first, root, "--eval-fraction", "0.5", *IN_MEMORY, capsys=capsys)[1]["span"] == 1
    index = Root(str(root)).content_index(1)
    reverse_lines(index)
    for path in sorted(first.rglob("*.*")):  # byte-identical copies under other names: other splits too
        target = again / path.parent.name / f"copy of {path.stem}{path.suffix}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    code, summary = ingest(again, root, "--eval-fraction", "0.5", *IN_MEMORY, capsys=capsys)
    assert code == 0 and not summary["published"] and summary["duplicates"] == 24, summary
    split = contents_by_split(root)
    assert not split["train"] & split["eval"] and Spans(str(root)).span_numbers() == [1]


def test_a_truncated_content_index_is_rebuilt_with_a_warning_not_a_traceback(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    photos(source, 6, "cat")
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1
    index = Root(str(root)).content_index(1)
    written = open(index, "rb").read()
    open(index, "wb").write(written[:len(written) // 2])

    photos(source, 2, "dog", start=50)
    code, _ = ingest(source, root, *IN_MEMORY)
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith(f"stoke: warning: {index}: damaged (") and "rebuilt" in err, err
    assert open(index, "rb").read() == written  # the index ingest wrote, whole again
    assert Spans(str(root)).span_numbers() == [1, 2]

    open(index, "wb").write(written[:len(written) // 2])  # and the data check, which reads its dHashes
    from components.datacheck import datacheck
    code = datacheck.run(["--root", str(root), "--span", "1", "--json"])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err and err.startswith(f"stoke: warning: {index}: "), err


def test_a_damaged_index_over_corrupt_shards_stops_ingest_in_one_line_naming_the_shard(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    photos(source, 6, "cat")
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1
    layout_root = Root(str(root))
    reverse_lines(layout_root.content_index(1))
    shard = Spans(layout_root).shards("train", [1], checked=False)[0].uri
    data = open(shard, "rb").read()
    open(shard, "wb").write(data[:len(data) // 2])
    photos(source, 2, "dog", start=50)
    code, _ = ingest(source, root, *IN_MEMORY)
    captured = capsys.readouterr()
    summary, err = json.loads(captured.out.strip().splitlines()[-1]), captured.err
    assert code == 1 and not summary["published"] and "Traceback" not in err, err
    assert err.count("\n") == 1 and f"shard {shard} is corrupt" in err, err
    assert Spans(layout_root).span_numbers() == [1]
