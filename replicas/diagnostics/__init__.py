"""Diagnostics: replica states, the monitor (wait-for graph), reports, flight recorder, traces."""
