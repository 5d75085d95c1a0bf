"""A network of the user's code before it runs: where its file is, the name it is known by, and the copy a
run folder keeps.

train.network names a built-in network, keras.applications.<Name>, `module:function` (a module the worker
imports) or `path/to/file.py:function`. A file reference is found against the folder of the configuration that
names it (the working folder for a command line without one) and stays in it: an absolute path, `..` and a link
leading out are refused. Where a configuration is read (`stoke run`, `up`, `deploy` and `config show`, a stage
program's --config), the reference becomes the file's real path, which the flow's parameters and a deployment's
then carry. A flow run copies the file into its run folder (`code/`) and its config.json names the copy, beside
it: every stage reads that copy, and a rerun from the config.json trains the same code.

A network is known by its identity: its name, `module:function`, or for a file `<file>.py:function` wherever the
file lies (a copy is the same network); with the SHA-256 of its code (components/common/networks.py), that is
what a warm start compares. Nothing here imports the user's code or TensorFlow.
"""
from __future__ import annotations

import os
import posixpath

from components.common.files import NotASmallFile, is_uri, join, read_small
from components.contracts.config import APPLICATIONS, network_parts
from components.contracts.layout import CODE, RunDir
from components.contracts.run_config import RunConfig

# A network's file is source code: a few hundred lines, rarely more than a few KB.
MAX_FILE_BYTES = 4 * 1024 * 1024


def folder_of(config_file: str | None) -> str:
    """The folder file references are found against: the configuration file's, or the working folder."""
    if not config_file:
        return os.getcwd()
    return posixpath.dirname(config_file.rstrip("/")) if is_uri(config_file) else \
        os.path.dirname(os.path.abspath(config_file))


def locate(reference: str, folder: str, *, trusted: bool = False) -> str:
    """`reference` with a file's path made the real path it names in `folder`; other kinds as they are. A
    ValueError, naming the reference, for a file outside `folder` or not there. `trusted`: the reference comes
    from where one was located already (a flow's parameters, a deployment's), so a path already absolute is kept."""
    kind, where, function = network_parts(reference)
    if kind != "file":
        return reference
    if is_uri(where) or os.path.isabs(where):
        if trusted:
            return reference
        raise ValueError(f"train.network {reference}: {where} is not beside the run configuration; name a file in "
                         f"{folder} or below it by its path from there")
    if is_uri(folder):  # a run's config.json in a bucket names the copy beside it; a bucket has no links
        return f"{join(folder, where)}:{function}"
    base = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(base, where))
    if os.path.commonpath([base, path]) != base:
        raise ValueError(f"train.network {reference}: {where} leads out of {folder} through a link; name a file in "
                         "that folder or below it")
    if not os.path.isfile(path):
        raise ValueError(f"train.network {reference}: no such file {os.path.join(folder, where)}")
    return f"{path}:{function}"


def located(config: RunConfig, folder: str, *, trusted: bool = False) -> RunConfig:
    """`config` with its train.network located (locate) against `folder`."""
    if config.train.network is None:
        return config
    train = config.train.model_copy(update={"network": locate(config.train.network, folder, trusted=trusted)})
    return config.model_copy(update={"train": train})


def identity(reference: str) -> str:
    """The name a network is known by across runs: a built-in's name, keras.applications.<Name>,
    `module:function`, and for a file `<file>.py:function` wherever the file lies."""
    kind, where, function = network_parts(reference)
    if kind == "builtin":
        return where
    if kind == "application":
        return APPLICATIONS + where
    return f"{posixpath.basename(where) if kind == 'file' else where}:{function}"


def code_of(reference: str) -> tuple[str, bytes]:
    """A file network's name and bytes: a regular file of at most MAX_FILE_BYTES; a ValueError naming it else."""
    _, where, _ = network_parts(reference)
    try:
        return posixpath.basename(where), read_small(where, MAX_FILE_BYTES, "a network's code")
    except FileNotFoundError:
        raise ValueError(f"train.network {identity(reference)}: no such file {where}") from None
    except (NotASmallFile, OSError) as error:
        raise ValueError(f"train.network {identity(reference)}: {error}") from None


def for_run(config: RunConfig, run: RunDir) -> tuple[RunConfig, dict[str, bytes]]:
    """The configuration a run records, with a file network named by its copy in the run folder's code/
    (`code/<file>.py:function`, found beside config.json), and the files to write there (URI: bytes); any other
    network as it is, with none. A ValueError naming the file when it cannot be read."""
    if config.train.network is None or network_parts(config.train.network)[0] != "file":
        return config, {}
    name, data = code_of(config.train.network)
    network = f"{CODE}/{name}:{network_parts(config.train.network)[2]}"
    return config.model_copy(update={"train": config.train.model_copy(update={"network": network})}), \
        {join(run.code, name): data}
