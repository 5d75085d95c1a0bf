"""The Prefect flows, their deployments and work pools, and the `stoke` command."""
