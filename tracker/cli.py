"""The `tracker` command line. Every option is also read from `WEIGHTSWARM_<OPTION>`."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """weightswarm tracker: BitTorrent tracker, manifest registry and origin leases."""
