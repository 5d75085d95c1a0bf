"""Preflight (`python -m components.preflight`, `stoke doctor`): disks, read speed, free space,
GPUs, /dev/shm and process limits, checked before any GPU hour is spent."""
