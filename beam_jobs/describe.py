"""The ingest summary as a person reads it (`stoke ingest` without --json)."""
from __future__ import annotations

import os


def describe(summary: dict) -> str:
    if not summary["published"]:
        return summary["message"]
    counts = summary["counts"]
    text = (f"{os.path.basename(summary['span_uri'])}: {counts['train']:,} train + {counts['eval']:,} eval "
            f"records in {summary['shards']} shards; {summary['new_sources']:,} new files in "
            f"{summary['seconds']:,.1f} s ({summary['images_per_sec'] or 0:,.0f} images/s)")
    if summary.get("unchanged"):
        text += f"\n{summary['unchanged']} files with a new version but published content were not new (recognised by content)"
    if counts.get("duplicates"):
        text += f"\n{counts['duplicates']} copies (and near-copies set aside) of images already published or listed were kept out"
    text += near_copies(summary.get("near_duplicates") or {})
    for finding in summary.get("quality") or []:
        where = ", ".join(f"{count} in {folder}" for folder, count in finding["folders"].items())
        text += f"\n{finding['count']} {finding['kind'].replace('_', ' ')} images kept ({where}), e.g. {finding['examples'][0]}"
    if counts["dead_letter"]:
        text += f"\n{counts['dead_letter']} set aside, reasons in {summary['dead_letter_uri']}:"
        text += "".join(f"\n  {d['uri']}: {d['reason']}" for d in summary["dead_letters"])
    return text


def near_copies(near: dict) -> str:
    text = ""
    if near.get("count"):
        text = (f"\n{near['count']} new images are near-copies of another (re-encoded, resized, cropped or mirrored): "
                f"{near.get('moved', 0)} joined their original's split, {near.get('set_aside', 0)} set aside, "
                f"{near.get('across', 0)} left in the other split")
        text += "".join(f"\n  {p['uri']} ({p['split']}) ~ {p['other_uri']} ({p['other_split']})" for p in near["examples"])
    if near.get("crowded"):
        text += (f"\n{near['crowded']} new images lie among pictures alike at dHash's 9x8 (a fixed camera, scans, "
                 "products on white): judged by their block colours, the distinct ones kept their own split")
    return text
