"""Before a driver joins a cluster (replicas/cluster/address.py): an address where no Ray answers
fails within the job's timeout with one line naming it; the GCS's refusal of a token-less call is
read as token authentication. The README's cluster test joins a token cluster for real."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from replicas.cluster import grpc_h2
from replicas.cluster.address import ClusterProbe, match_authentication, probe
from replicas.errors import ReplicaFailure

BIN = Path(sys.executable).parent

# What Ray's GCS (2.60) sent back for a GetClusterId without a token.
REFUSAL = (b"\x88@\x0ccontent-type\x10application/grpc\x00\x0bgrpc-status\x0216\x00\x0cgrpc-message>"
           b"InvalidAuthToken: Authentication token is missing or incorrect")


def test_a_refusal_without_token_reads_as_token_authentication() -> None:
    fields = grpc_h2.header_fields(REFUSAL)
    assert fields[b"grpc-status"] == grpc_h2.UNAUTHENTICATED
    assert grpc_h2.header_fields(b"\x88\x00\x0bgrpc-status\x82\x00") == {}  # Huffman-coded: not read


def test_a_silent_listener_is_no_cluster() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(ReplicaFailure, match=f"no Ray cluster answered at {address} within 0.5 s"):
            probe(address, 0.5)


def test_a_chosen_mode_that_is_not_the_clusters_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(ReplicaFailure, match="uses no authentication but RAY_AUTH_MODE=token here"):
        match_authentication(ClusterProbe("127.0.0.1:9", "disabled"))


def test_an_unreachable_address_fails_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        program = tmp_path / "p.hlo"
        program.write_text("HloModule m, replica_count=2\n\nENTRY e {\n  ROOT c = f32[] constant(1)\n}\n")
        done = subprocess.run([str(BIN / "replicas"), "run", str(program), "--address", f"127.0.0.1:{port}",
                               "--timeout", "2", "--quiet"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    # Within what is left of the 2 s by the time the address is asked (a loaded machine took a moment).
    assert re.match(rf"ReplicaFailure: no Ray cluster answered at 127\.0\.0\.1:{port} within (2|1\.\d) s", line), line
