"""Errors that name an instruction also name its source (the module's metadata), once the job
ends on the driver, which holds the module: a replica's failure names `%y (custom-call)`, the
error the user sees `%y (custom-call) from loss at train.py:42 in step (jit(step)/loss)`.
Deadlock and timeout reports take the `SourceMap` when they are made (`Monitor`, `Report`)."""

from __future__ import annotations

import re

from replicas.collectives.mismatch import MismatchReport
from replicas.diagnostics.report import source_suffix
from replicas.errors import CollectiveMismatchError, ReplicaFailure, ReplicasError
from replicas.hlo.source import SourceMap

_NAMED = re.compile(r"^%([A-Za-z_][A-Za-z0-9_.\-]*)")


def with_sources(error: ReplicasError, sources: SourceMap) -> ReplicasError:
    """`error` naming the source of the instructions it names (itself, when there is nothing to add)."""
    if not sources:
        return error
    if isinstance(error, ReplicaFailure) and isinstance(error.instruction, str):
        m = _NAMED.match(error.instruction)
        suffix = source_suffix(sources, m.group(1)) if m else ""
        if not suffix or suffix in error.instruction:
            return error
        instruction = error.instruction + suffix
        message = str(error)
        message = message.replace(error.instruction, instruction, 1) if error.instruction in message \
            else f"{message} (in {instruction})"
        annotated = ReplicaFailure(message, error.replica, error.cause, instruction=instruction)
        annotated.__dict__.update({k: v for k, v in error.__dict__.items() if k != "instruction"})
        annotated.instruction = instruction
        return annotated
    report = getattr(error, "report", None)
    if isinstance(error, CollectiveMismatchError) and isinstance(report, MismatchReport):
        for identity in report.instructions.values():
            name = (identity or {}).get("name")
            text = sources.text(name, (identity or {}).get("computation")) if name else None
            if text:
                report.sources[str(name)] = text
        if report.sources:
            return CollectiveMismatchError(str(error).split("\n", 1)[0], report)
    return error
