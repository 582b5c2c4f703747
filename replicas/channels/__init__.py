"""Send/recv channels (replica to replica, or with the host) and infeed/outfeed.

Importing the package registers their kernels.
"""

from replicas.channels import feeds, send_recv  # noqa: F401  (registers the kernels)
