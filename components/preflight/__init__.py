"""Preflight (`python -m components.preflight`, `stoke preflight`): disks, read speed, free space,
GPUs, /dev/shm and process limits, checked before any GPU hour is spent."""
