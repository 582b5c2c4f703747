"""The `ray` command line, for the nodes of a cluster of this one machine (`replicas cluster start
--local`, replicas/cluster/local.py): a node started with `--node-ip-address=127.0.0.1` keeps that address.

Why: `ray start` replaces a loopback address by the machine's routable one
(`ray._private.services.resolve_ip_for_localhost`), and a node whose address is not 127.0.0.1
has its GCS, raylet and workers listen on every interface and its agents on that address. With
127.0.0.1 kept, everything the cluster starts listens on loopback only (tests/test_loopback.py)."""

import sys


def main() -> int:
    from ray._private import services

    services.resolve_ip_for_localhost = lambda host: host
    from ray.scripts.scripts import main as ray_main  # after the patch, which it must see

    return ray_main()


if __name__ == "__main__":
    sys.exit(main())
