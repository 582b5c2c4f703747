"""Collectives over the fabric: replica groups, fingerprints (matching), algorithms and kernels.

Importing the package registers the collective kernels (and replica-id / partition-id).
"""

from replicas.collectives import kernels, ragged  # noqa: F401  (registers the kernels)
