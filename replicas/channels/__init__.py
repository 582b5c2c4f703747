"""Send/recv channels (replica to replica, or with the host) and infeed/outfeed.

Importing the package registers their kernels.
"""

from replicas.channels import channels, feeds  # noqa: F401  (registers the kernels)
