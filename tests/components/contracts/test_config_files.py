"""A file named for settings or options is read only when it is a small regular file holding plain data:
a FIFO, a device, a folder or a file past the size cap is refused before it is read, and YAML's aliases,
tags beyond JSON's types and deep nesting are refused where the parser meets them. Each is one line
naming the file, exit 2, from every entry point that reads one, before anything is written."""
from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
import threading

import pytest

from components.common import config_files
from components.common.program import stage_arguments, stage_config
from flows import cli

BIN = os.path.dirname(sys.executable)
PLAIN = "settings are text, numbers, true/false, null, lists and groups"


def at_once(call, *args):
    """`call(*args)`, failing the test instead of waiting for good (a FIFO's open waits for a writer)."""
    done = []

    def work():
        try:
            done.append((call(*args), None))
        except Exception as error:
            done.append((None, error))

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(30)
    assert done, f"{call.__name__} still waits after 30 s"
    result, error = done[0]
    if error is not None:
        raise error
    return result


def not_a_file(kind: str, tmp_path, what: str = "a settings file", limit: int = 1024 * 1024) -> tuple[str, str]:
    """A path of `kind` and what the error line says of it, for a file of `what` holding at most `limit` bytes."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "settings.yaml")
        return str(tmp_path / "settings.yaml"), f"is a FIFO, not {what}: name a regular file"
    if kind == "device":
        return "/dev/null", f"/dev/null is a device, not {what}: name a regular file"
    if kind == "folder":
        (tmp_path / "settings").mkdir()
        return str(tmp_path / "settings"), f"is a folder, not {what}: name a regular file"
    (tmp_path / "settings.yaml").write_text("# " + "x" * limit + "\n")
    return str(tmp_path / "settings.yaml"), f"is {limit + 3:,} bytes, larger than {what} ({limit:,} at most)"


def run_with(config: str, tmp_path, capsys, *argv: str) -> str:
    """`stoke run` with `--config config`: its one error line, after checking exit 2 and nothing written."""
    (tmp_path / "images").mkdir(exist_ok=True)
    code = at_once(cli.main, ["run", str(tmp_path / "images"), "--root", str(tmp_path / "root"), "--config", config,
                              *argv])
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err, captured.err
    (line,) = captured.err.strip().splitlines()
    assert not (tmp_path / "root").exists()
    return line


@pytest.mark.parametrize("kind", ["fifo", "device", "folder", "too big"])
def test_a_settings_file_that_is_no_small_regular_file_is_refused_before_it_is_read(kind, tmp_path, capsys):
    path, says = not_a_file(kind, tmp_path)
    line = run_with(path, tmp_path, capsys)
    assert line.startswith(f"stoke run: error: {path}") and line.endswith(says), line


def _memory_cap():
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom"])
def test_a_device_that_never_ends_is_refused_not_read(path, tmp_path):
    """In a child capped at 3 GB of address space: read whole, /dev/zero grows by gigabytes a minute."""
    done = subprocess.run([os.path.join(BIN, "stoke"), "run", str(tmp_path), "--root", str(tmp_path / "root"),
                           "--config", path], capture_output=True, text=True, timeout=120, preexec_fn=_memory_cap)
    assert done.returncode == 2, done.stderr[-500:]
    assert done.stderr.strip() == f"stoke run: error: {path} is a device, not a settings file: name a regular file"


BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{b}'] * 9)}]\n" for b, a in zip("abcd", "bcde"))
NOT_PLAIN = [
    ("aliases.yaml", "a: &a [x, x, x, x, x, x, x, x, x]\n" + BOMB, "line 2: an alias (*a) repeats another value; "
     "write the value out"),
    ("itself.yaml", "train: &t\n  epochs: *t\n", "line 2: an alias (*t) repeats another value"),
    ("merge.yaml", "common: &c {epochs: 3}\ntrain:\n  <<: *c\n", "line 3: a merge key (<<) is no setting's value"),
    ("date.yaml", "train:\n  spans: 2026-01-01\n", "line 2: a date (2026-01-01; quote it to mean text) is no "
     f"setting's value ({PLAIN})"),
    ("time.yaml", "train:\n  weights: 2026-01-01 10:00:00\n", "line 2: a date (2026-01-01 10:00:00;"),
    ("binary.yaml", "train:\n  weights: !!binary aGVsbG8=\n", "line 2: the tag !!binary is no setting's value"),
    ("set.yaml", "train: !!set {epochs, seed}\n", "line 1: the tag !!set is no setting's value"),
    ("omap.yaml", "train: !!omap [epochs: 3]\n", "line 1: the tag !!omap is no setting's value"),
    ("python.yaml", "train: !!python/object/apply:os.system [echo]\n",
     "line 1: the tag !!python/object/apply:os.system is no setting's value"),
    ("local.yaml", "train: !mine {epochs: 3}\n", "line 1: the tag !mine is no setting's value"),
    ("deep.yaml", "train: " + "[" * 5000 + "]" * 5000 + "\n", "line 1: nested more than 32 deep"),
    ("deep-block.yaml", "".join(f"{'  ' * i}k{i}:\n" for i in range(100)), "line 32: nested more than 32 deep"),
    ("deep.json", '{"train": ' + "[" * 5000 + "]" * 5000 + "}", "nested more than 32 deep"),
    ("deeper.json", '{"train": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested more than 32 deep"),
    # What YAML 1.1 (PyYAML) reads as a number that YAML 1.2 and JSON read otherwise: refused, not guessed.
    ("base60.yaml", "train:\n  epochs: 1:30\n", "line 2: 1:30 is 90 in YAML 1.1 (a number in base 60) but text in "
     "YAML 1.2; write 90, or quote it for text"),
    ("base60-float.yaml", "train:\n  learning_rate: -1:30.5\n", "line 2: -1:30.5 is -90.5 in YAML 1.1 (a number in "
     "base 60) but text in YAML 1.2; write -90.5, or quote it for text"),
    ("octal.yaml", "train:\n  seed: 0755\n", "line 2: 0755 is 493 in YAML 1.1 (an octal number) but 755 in YAML 1.2; "
     "write 493 or 755"),
    ("octal-key.yaml", "train:\n  010: 1\n", "line 2: 010 is 8 in YAML 1.1"),
    # A key given twice: YAML and JSON readers keep the last, silently.
    ("twice.yaml", "train: {epochs: 2}\ntrain: {epochs: 3}\n", "line 2: train is given twice in one group; keep one"),
    ("twice-inside.yaml", "train:\n  epochs: 2\n  seed: 1\n  epochs: 3\n", "line 4: epochs is given twice in one group"),
    ("twice.json", '{"train": {"epochs": 2, "seed": 1, "epochs": 3}}', "'epochs' is given twice in one group; keep one"),
]


@pytest.mark.parametrize("name, text, says", NOT_PLAIN, ids=[case[0] for case in NOT_PLAIN])
def test_a_settings_file_that_is_not_plain_data_is_one_line_naming_the_file_and_line(name, text, says, tmp_path,
                                                                                      capsys):
    (tmp_path / name).write_text(text)
    line = run_with(str(tmp_path / name), tmp_path, capsys)
    assert line.startswith(f"stoke run: error: {tmp_path / name}: {says}"), line


def test_plain_settings_still_read_as_before(tmp_path):
    (tmp_path / "plain.yaml").write_text("# a comment\nanchored: &fine 3\ntrain:\n  epochs: 3\n  spans: '2026-01-01'\n"
                                         "  weights: null\n  flip: yes\n  seed: 0\n  trace_steps: '1:30'\n"
                                         "beam_args: [--direct_num_workers=1]\n"
                                         "ingest: {shard_mb: 1.5e+2, max_side: 0x200, max_file_mb: 1_000, blank_std: 00}\n"
                                         "gate: {top_k: 1, decision: point}\npush: {keep: 3}\n")
    assert config_files.read_file(str(tmp_path / "plain.yaml")) == {
        "anchored": 3, "train": {"epochs": 3, "spans": "2026-01-01", "weights": None, "flip": True, "seed": 0,
                                 "trace_steps": "1:30"},
        "beam_args": ["--direct_num_workers=1"], "ingest": {"shard_mb": 150.0, "max_side": 512, "max_file_mb": 1000,
                                                            "blank_std": 0},
        "gate": {"top_k": 1, "decision": "point"}, "push": {"keep": 3}}


def test_an_override_giving_a_key_twice_is_one_line(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    code = cli.main(["run", str(tmp_path / "images"), "--root", str(tmp_path / "root"),
                     "--set", 'train={"epochs": 2, "epochs": 3}'])
    assert code == 2
    assert capsys.readouterr().err.strip() == "stoke run: error: --set train: 'epochs' is given twice in one group; keep one"
    assert not (tmp_path / "root").exists()


def test_a_stage_programs_settings_file_is_read_alike(tmp_path):
    path, says = not_a_file("fifo", tmp_path)
    with pytest.raises(config_files.ConfigError, match=f"^{path} {says}$"):
        at_once(stage_config, "train", stage_arguments("train", ["--config", path]))
    (tmp_path / "alias.yaml").write_text("root: &r /tmp\nrun_id: *r\n")
    with pytest.raises(config_files.ConfigError, match="alias.yaml: line 2: an alias"):
        stage_config("train", stage_arguments("train", ["--config", str(tmp_path / "alias.yaml")]))


def test_an_override_nested_past_the_bound_is_one_line(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    code = cli.main(["run", str(tmp_path / "images"), "--root", str(tmp_path / "root"),
                     "--set", "train=" + "[" * 100_000 + "]" * 100_000])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.strip() == "stoke run: error: --set train: nested more than 32 deep"


@pytest.mark.parametrize("option", ["--config", "--beam-args-file", "--auth-string-file"])
@pytest.mark.parametrize("kind", ["fifo", "device", "too big"])
def test_stoke_up_reads_the_files_it_is_given_alike(option, kind, tmp_path, capsys):
    from components.common.config_files import OPTION_FILE_BYTES

    path, says = not_a_file(kind, tmp_path) if option == "--config" else not_a_file(
        kind, tmp_path, f"the file of {option}", OPTION_FILE_BYTES)
    before = dict(os.environ)
    code = at_once(cli.main, ["up", "--source", str(tmp_path), "--root", str(tmp_path / "root"), option, path])
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err, captured.err
    assert captured.err.strip().endswith(says) and path in captured.err and len(captured.err.splitlines()) == 1
    assert dict(os.environ) == before  # nothing set for a server that never starts


@pytest.mark.parametrize("option", ["--config", "--beam-args-file", "--base-job-template"])
def test_stoke_deploy_reads_the_files_it_is_given_alike(option, tmp_path, capsys, monkeypatch):
    from flows import work_pools

    monkeypatch.setenv(work_pools.POOL_ENV, "process")
    path, says = not_a_file("fifo", tmp_path, "a settings file" if option == "--config" else f"the file of {option}")
    code = at_once(work_pools.main, ["--source", str(tmp_path), "--root", str(tmp_path / "root"), option, path])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.strip().endswith(f"{path} {says}"), captured.err
    (tmp_path / "template.json").write_text('{"job_configuration": ' + "[" * 5000 + "]" * 5000 + "}")
    code = work_pools.main(["--source", str(tmp_path), "--root", str(tmp_path / "root"), "--base-job-template",
                            str(tmp_path / "template.json")])
    assert code == 2 and "is not a JSON job template: nested more than 32 deep" in capsys.readouterr().err


def test_config_show_reads_its_file_alike(tmp_path, capsys):
    path, says = not_a_file("fifo", tmp_path)
    assert at_once(cli.main, ["config", "show", "--config", path]) == 2
    assert capsys.readouterr().err.strip() == f"stoke config: error: {path} {says}"


def unreadable(kind: str, tmp_path) -> tuple[str, str]:
    """A path that names no readable text of `kind`, and what the error line says of it after the path."""
    if kind == "missing":
        return str(tmp_path / "nowhere"), ": no such file"
    if kind == "latin-1":
        (tmp_path / "latin-1").write_bytes("caf\xe9\n".encode("latin-1"))
        return str(tmp_path / "latin-1"), " is not UTF-8 text"
    if kind == "below a file":
        (tmp_path / "file").write_text("")
        return str(tmp_path / "file" / "arrived"), " cannot be read: Not a directory"
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    return str(tmp_path / "loop"), " cannot be read: Too many levels of symbolic links"


@pytest.mark.parametrize("kind", ["fifo", "missing", "latin-1", "below a file", "link loop"])
def test_ingest_reads_an_arrived_file_alike(kind, tmp_path, capsys):
    """As the flows read the files their options name: one line naming --arrived and the file, exit 1."""
    import json

    from beam_jobs import ingest

    (tmp_path / "images" / "cat").mkdir(parents=True)
    if kind == "fifo":
        path, says = not_a_file("fifo", tmp_path, "the file of --arrived")
        says = f" {says}"
    else:
        path, says = unreadable(kind, tmp_path)
    code = at_once(ingest.run, [str(tmp_path / "images"), "--root", str(tmp_path / "root"), "--arrived", path,
                                "--json"])
    captured = capsys.readouterr()
    assert code == 1 and "Traceback" not in captured.err, captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["error"] == f"--arrived {path}{says}"


HELD = [
    ("träin:\n  epochs: 3\n", "träin: no such setting"),
    ("train:\n  wings: 3\n", "train.wings: no such setting"),
    ("train:\n  epochs:\n    x: 1\n", "train.epochs: Input should be a valid integer"),
    ("train: null\n", "train: Input should be a valid dictionary or instance of TrainConfig"),
    ("train:\n  learning_rate: 1.0e999\n", "train.learning_rate: Input should be a finite number"),
    ("ingest:\n  shard_mb: .inf\n", "ingest.shard_mb: Input should be a finite number"),
    ("model_name: ../x\n", "model_name: bad model name '../x'"),
    ("beam_args: ['--direct_num_workers=100000']\n", "beam_args: '--direct_num_workers=100000': a whole "
     "number from 1 to at most"),
]


@pytest.mark.parametrize("text, says", HELD)
def test_what_a_settings_file_could_always_not_say_is_still_one_line(text, says, tmp_path, capsys):
    (tmp_path / "settings.yaml").write_text(text, encoding="utf-8")
    line = run_with(str(tmp_path / "settings.yaml"), tmp_path, capsys)
    assert line.startswith(f"stoke run: error: {says}"), line


def test_a_store_that_is_away_is_raised_as_it_is_for_a_retry(monkeypatch):
    """A reset connection is the weather: the program's exit 75 retries it, where a ConfigError would not."""
    def reset(*args):
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    monkeypatch.setattr(config_files, "read_small", reset)
    with pytest.raises(ConnectionResetError):
        config_files.read_option_file("s3://bucket/arrived.txt", "--arrived")
