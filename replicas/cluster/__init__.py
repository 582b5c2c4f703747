"""Ray clusters: what a driver learns about a cluster before it joins one (`address`), and
simulated hosts on one machine (`hosts`, the `replicas cluster` command)."""
